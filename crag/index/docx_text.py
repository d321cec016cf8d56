"""The text of a Word document's XML, one line per paragraph or table row, in reading order.

``blocks`` walks a body, header, footer or notes part: paragraphs (hyperlinks, tracked
insertions, fields and content controls included; deletions and field codes not), a text box's
paragraphs after the paragraph that anchors it, a table's rows with a nested table in its
cell's text. ``not_word`` tells a Word package (a document, a macro-enabled document, a
template) from another Office package renamed ``.docx``. The reader (``crag.index.readers``)
opens the package and owns the limits.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["PARTS", "Budget", "blocks", "not_word"]


class Budget(Protocol):
    def add(self, text: str) -> None: ...


# The main parts of Word's own packages (documents, macro-enabled documents, templates).
_WORD = ("application/vnd.openxmlformats-officedocument.wordprocessingml.", "application/vnd.ms-word.")
# What a package whose main part is not Word's is, by its content type.
_OTHERS = (("spreadsheetml", "an Excel workbook"), ("ms-excel", "an Excel workbook"),
           ("presentationml", "a PowerPoint presentation"), ("ms-powerpoint", "a PowerPoint presentation"))


def not_word(content_type: str) -> str | None:
    """What a package whose main part has ``content_type`` is, when it is not a Word document."""
    if content_type.startswith(_WORD):
        return None
    return next((kind for key, kind in _OTHERS if key in content_type), f"a package of {content_type or 'unknown content'}")


# The parts of a DOCX besides its body that hold text a person reads, in the order they are read.
PARTS = ("header", "footer", "footnotes", "endnotes")
# Inline elements whose text is not shown: deleted revisions, field codes, the fallback
# copy of a drawing (its text box is also in the drawing itself), properties.
_HIDDEN = frozenset({"del", "moveFrom", "delText", "instrText", "delInstrText", "Fallback", "pPr", "rPr", "sectPr"})
_CHARS = {"tab": "\t", "ptab": "\t", "br": " ", "cr": " ", "noBreakHyphen": "-"}
# A no-break space, and a line break written into a run's text (as Apache POI writes "a\nb"; Word
# shows a space), read as spaces: a paragraph is one line.
_SPACES = str.maketrans({"\u00a0": " ", "\n": " ", "\r": " "})


def _local(element: object) -> str:
    tag = getattr(element, "tag", None)
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def blocks(parent: object, lines: list[str], budget: Budget) -> None:
    """The lines of the paragraphs and table rows under ``parent``, in the document's order:
    through content controls and custom XML, a text box's paragraphs after its anchor's line."""
    for child in parent:  # type: ignore[attr-defined]
        tag = _local(child)
        if tag == "p":
            words: list[str] = []
            boxes: list[object] = []
            _inline(child, words, boxes)
            if words or not boxes:
                lines.append("".join(words).translate(_SPACES))
                budget.add(lines[-1])
            for box in boxes:
                blocks(box, lines, budget)
        elif tag == "tbl":
            for row in child.iter("{*}tr"):
                if _nearest(row, "tbl") is not child:  # a nested table's row: read in its cell
                    continue
                cells = []
                for cell in row.iter("{*}tc"):
                    if _nearest(cell, "tr") is not row:
                        continue
                    inner: list[str] = []
                    blocks(cell, inner, budget)
                    cells.append(" ".join(" ".join(inner).split()))
                lines.append(" | ".join(dict.fromkeys(cells)))  # merged cells repeat
                budget.add(lines[-1])
        elif tag in ("footnote", "endnote"):
            if not any(v.endswith(("separator", "Separator", "Notice")) for k, v in child.attrib.items() if k.endswith("}type")):
                blocks(child, lines, budget)  # not the separator line Word draws above the notes
        elif tag in ("sdt", "sdtContent", "customXml", "txbxContent", "body"):
            blocks(child, lines, budget)


def _nearest(element: object, name: str) -> object | None:
    """The closest ancestor of ``element`` named ``name``."""
    up = element.getparent()  # type: ignore[attr-defined]
    while up is not None and _local(up) != name:
        up = up.getparent()
    return up


def _inline(element: object, words: list[str], boxes: list[object]) -> None:
    """The text of a paragraph's runs (hyperlinks, insertions, fields and controls included);
    the text boxes it anchors are gathered in ``boxes``, read after it."""
    for child in element:  # type: ignore[attr-defined]
        tag = _local(child)
        if tag == "t":
            words.append(child.text or "")
        elif tag in _CHARS:
            words.append(_CHARS[tag])
        elif tag == "txbxContent":
            boxes.append(child)
        elif tag and tag not in _HIDDEN:
            _inline(child, words, boxes)
