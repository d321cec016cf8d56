"""Documents that are not plain text, read as text: PDF, DOCX and HTML.

One record per reader: the suffixes it reads, the module it needs, the optional extra that
installs that module, and the function from the file's bytes to text. Discovery takes a
file with a reader's suffix when the reader's module can be imported, and otherwise counts
it among the files skipped for their type, with the ``pip install`` that includes them
(``skipped_line``). The text keeps crag's line numbers meaningful to a person:

* **PDF** (``pypdf``, extra ``pdf``): page after page, each starting at line
  ``(page - 1) * PAGE_LINES + 1`` (``crag.pages``), so a citation reads ``guide.pdf:p3:L12``:
  page 3, the 12th line of text on it.
* **DOCX** (``python-docx``, extra ``docx``): one line per paragraph or table row, in the
  order of the document, so ``report.docx:L12`` is its 12th paragraph.
* **HTML** (the standard library's ``html.parser``): the text only (no tags, scripts or
  styles; entities decoded), each piece on the line it has in the HTML file, so
  ``page.html:L42`` opens the source where the text is.

A document that its library cannot read raises ``ValueError`` with the reason, which the
indexer reports as a skipped file. Texts already read are kept for the process's life
(keyed by path, size and modification time), so ``grep_search`` does not parse a PDF again
for every question.
"""

from __future__ import annotations

import importlib.util
import io
import os
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

from attrs import frozen

from ..pages import PAGE_LINES

__all__ = ["DISTRIBUTION", "READERS", "Reader", "cached_text", "decode_text", "reader_for", "skipped_line"]

# The name crag is installed under from the package index (the import name stays ``crag``).
DISTRIBUTION = "crag-kb"


@frozen
class Reader:
    name: str
    suffixes: tuple[str, ...]
    module: str | None  # what must be importable; None: the standard library
    extra: str | None  # the optional extra that installs it
    read: Callable[[bytes], str]

    def available(self) -> bool:
        return self.module is None or importlib.util.find_spec(self.module) is not None


def _pdf(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise ValueError("the PDF is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
    except PyPdfError as exc:
        raise ValueError(f"pypdf cannot read it ({exc})") from exc
    out: list[str] = []
    for text in pages:
        lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
        if len(lines) > PAGE_LINES:  # keep every word, on the page's last line
            lines[PAGE_LINES - 1 :] = [" ".join(lines[PAGE_LINES - 1 :])]
        out += lines + [""] * (PAGE_LINES - len(lines))
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def _docx(data: bytes) -> str:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx raises zipfile, lxml and its own errors alike
        raise ValueError(f"python-docx cannot read it ({type(exc).__name__}: {exc})") from exc
    lines: list[str] = []
    for child in document.element.body.iterchildren():
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "p":
            lines.append(" ".join(Paragraph(child, document).text.split("\n")))
        elif tag == "tbl":
            for row in Table(child, document).rows:
                cells = dict.fromkeys(" ".join(c.text.split()) for c in row.cells)  # merged cells repeat
                lines.append(" | ".join(cells))
    return "\n".join(lines) + "\n" if lines else ""


def decode_text(data: bytes) -> str:
    """Bytes to text: UTF-8 (BOM dropped), else cp1252, else latin-1; newlines normalised.

    NUL bytes are dropped: a file with one in its first 8 KiB is binary (``is_binary``) and
    never decoded; one further on is padding, and PostgreSQL refuses it in text. One rule,
    for every store and for ``read_file`` and ``grep_search``, so lines and chunks agree.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\x00" in data:
        data = data.replace(b"\x00", b"")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        try:
            text = data.decode("cp1252")
        except UnicodeDecodeError:
            text = data.decode("latin-1")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _html(data: bytes) -> str:
    from html.parser import HTMLParser  # imported here: a search that reads no HTML never loads it

    class HTMLText(HTMLParser):
        """Collects the text of an HTML document on the lines where it stands in the source."""

        SKIP = frozenset({"script", "style", "template", "noscript", "svg"})

        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.lines: dict[int, list[str]] = {}
            self.skipping: list[str] = []

        def handle_starttag(self, tag: str, attrs: object) -> None:
            if tag in self.SKIP:
                self.skipping.append(tag)

        def handle_endtag(self, tag: str) -> None:
            if tag in self.skipping:
                while self.skipping and self.skipping.pop() != tag:
                    pass

        def handle_data(self, data: str) -> None:
            if self.skipping:
                return
            line, _ = self.getpos()
            for n, piece in enumerate(data.split("\n")):
                if piece.strip():
                    self.lines.setdefault(line + n, []).append(" ".join(piece.split()))

    text = decode_text(data)
    parser = HTMLText()
    parser.feed(text)
    parser.close()
    total = text.count("\n") + (0 if text.endswith("\n") else 1)
    lines = [" ".join(parser.lines.get(n, ())) for n in range(1, total + 1)]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


READERS: tuple[Reader, ...] = (
    Reader("PDF", (".pdf",), "pypdf", "pdf", _pdf),
    Reader("DOCX", (".docx",), "docx", "docx", _docx),
    Reader("HTML", (".html", ".htm", ".xhtml"), None, None, _html),
)
_BY_SUFFIX = {suffix: r for r in READERS for suffix in r.suffixes}


def reader_for(name: str) -> Reader | None:
    """The reader of a file name's suffix, or None for text read as it is."""
    _, dot, suffix = name.lower().rpartition(".")
    return _BY_SUFFIX.get("." + suffix) if dot else None


_CACHE: OrderedDict[tuple[str, int, int], str] = OrderedDict()
_CACHE_BYTES = 64 * 1024 * 1024
_cached_bytes = 0


def cached_text(path: str, reader: Reader, data: bytes | None = None) -> str:
    """The text of the document at ``path``, read once per (path, size, mtime) in a process.

    Raises ``OSError`` when it cannot be read and ``ValueError`` when its reader cannot make
    text of it."""
    global _cached_bytes
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    text = _CACHE.get(key)
    if text is not None:
        _CACHE.move_to_end(key)
        return text
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    text = reader.read(data)
    _CACHE[key] = text
    _cached_bytes += len(text)
    while _cached_bytes > _CACHE_BYTES and len(_CACHE) > 1:
        _, old = _CACHE.popitem(last=False)
        _cached_bytes -= len(old)
    return text


def skipped_line(suffixes: Iterable[str], command: str = "pip install") -> str | None:
    """One line for the files left out for their type: how many of each, and how to include
    those a reader could read (``None`` when none was left out)."""
    counts = Counter(suffixes)
    if not counts:
        return None
    shown = ", ".join(f"{n} {s or 'no suffix'}" for s, n in counts.most_common(6))
    more = len(counts) - 6
    line = f"skipped by type: {shown}{f' and {more} more types' if more > 0 else ''}"
    extras = sorted({r.extra for s in counts if (r := _BY_SUFFIX.get(s)) is not None and r.extra and not r.available()})
    if extras:
        line += f" (to include them: {command} '{DISTRIBUTION}[{','.join(extras)}]')"
    return line
