"""The text of an HTML document, on the lines where it stands in the source, in linear time.

A small scanner in the manner of the HTML5 tokenizer, written for one purpose: finding the
text a person reads, never building a tree. Markup is skipped: tags (their quoted attribute
values may hold ``>``), comments, ``<!...>`` declarations and ``<?...?>`` instructions, and
the contents of ``script``, ``style``, ``template``, ``noscript``, ``svg`` and ``nav`` (a
site's menu, the same on every page). Entities are decoded (``html.unescape``), soft hyphens
dropped. Pieces of text that markup separates on one line are joined by a space; the text of
a ``<pre>`` keeps its spaces and indentation, as code reads.

Every search for the end of a construct (``>``, a closing quote, ``-->``, ``</script``) that
finds none ends the scan: as in a browser, an unterminated tag or comment runs to the end of
the file. So each character is looked at a bounded number of times, whatever the input;
the standard library's ``html.parser`` instead re-scans the rest of the file after each
unterminated construct (``<a `` repeated 20,000 times took it minutes). A ``script`` or
``style`` that closes itself (``<script src="app.js"/>``, as XHTML pages write it) is empty:
the text after it is read.

``declared_codec`` finds the character set a page declares in its first bytes (``<meta
charset>``, ``<meta http-equiv="Content-Type">``, an XML declaration's ``encoding``), which
the reader decodes the page with.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from .decoding import INVISIBLE

__all__ = ["declared_codec", "html_text"]

# Elements whose content is not text a reader sees (nested tags inside still count).
_SKIP = frozenset({"script", "style", "template", "noscript", "svg", "nav"})
# Elements whose content is raw text up to their end tag: no markup is recognised inside.
_RAW = frozenset({"script", "style"})

_TAG_NAME = re.compile(r"[^\t\n\f\r />]*")
_TAG_STOP = re.compile(r"[>\"']")
_CHECK_EVERY = 1024  # constructs scanned between two calls of html_text's `check`
_COMMENT_END = re.compile(r"--!?>")
_RAW_END = {name: re.compile(rf"</{name}[\t\n\f\r />]", re.IGNORECASE) for name in _RAW}
# A <pre>'s text as it is, but soft hyphens, zero-width spaces and word joiners dropped and a
# line break an entity writes ("&#10;") read as a space: each line of text stays on its line of
# the source.
_PRE_TEXT = str.maketrans(dict.fromkeys(INVISIBLE) | {"\r": " ", "\n": " "})
# Text outside a <pre>: soft hyphens, zero-width spaces and word joiners an entity writes
# ("wam&#8203;bler") dropped, as a text file drops them, for they split the word they sit in.
_INVISIBLE = str.maketrans(dict.fromkeys(INVISIBLE))


# Where a page may declare its character set, and how: ``<meta charset=...>``, the charset of a
# ``<meta http-equiv="Content-Type" content="...; charset=...">``, ``<?xml ... encoding="..."?>``.
_DECLARED_IN = 4096
_DECLARATION = re.compile(
    rb"<meta\b[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]+)|<\?xml\b[^>]*?encoding\s*=\s*[\"']([A-Za-z0-9_.:-]+)",
    re.IGNORECASE,
)
# Names browsers read as a larger character set than the one they name (the WHATWG Encoding
# Standard): a page declaring Latin-1 or Shift_JIS is decoded as the superset its author's tools wrote.
_SUPERSETS = {"iso8859-1": "cp1252", "ascii": "cp1252", "iso8859-9": "cp1254", "shift_jis": "cp932",
              "euc_kr": "cp949", "gb2312": "gb18030", "gbk": "gb18030", "tis-620": "cp874"}


# A comment as the prescan skips it: to the first "-->", whose dashes may be the opening's own
# ("<!-->" and "<!--->" are whole comments); one never closed hides the rest. A tag is read
# whole, its quoted values too, so a "<!--" inside one (title="<!--") opens no comment.
_COMMENT_OR_TAG = re.compile(
    rb"(<!--(?:>|->|.*?-->|.*\Z))|<[A-Za-z][^>\"']*(?:(?:\"[^\"]*\"|'[^']*')[^>\"']*)*>?", re.S)


def declared_codec(data: bytes) -> str | None:
    """The Python codec of the character set the page ``data`` declares in its first 4 KiB, or
    None: no declaration, a name Python does not know, or a set in which the declaration's own
    bytes would not read as they do (UTF-16, UTF-32, EBCDIC: their text could not say so in
    ASCII)."""
    import codecs

    # as a browser's prescan reads it: a declaration inside a comment declares nothing
    comments = [m.span(1) for m in _COMMENT_OR_TAG.finditer(data, 0, _DECLARED_IN) if m.group(1)]
    found = next((m for m in _DECLARATION.finditer(data, 0, _DECLARED_IN)
                  if not any(a <= m.start() < b for a, b in comments)), None)
    if found is None:
        return None
    name = (found.group(1) or found.group(2)).decode("ascii").lower()
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        return None
    try:
        as_declared = found.group(0).decode(codec)
    except (UnicodeError, LookupError):  # punycode raises a bare UnicodeError
        return None
    if codec.startswith(("utf-16", "utf-32", "utf-7")) or as_declared != found.group(0).decode("latin-1"):
        return None  # the declaration itself would not read so: EBCDIC, say (UTF-7 browsers refuse)
    return _SUPERSETS.get(codec, codec)


def _tag_end(text: str, i: int) -> int:
    """The index just after the ``>`` that ends the tag whose attributes start at ``i``, or
    ``len(text)`` when none does. A quote opens a value only after ``=`` (and spaces), as in
    HTML5; a quote inside a name or an unquoted value is an ordinary character."""
    n = len(text)
    while True:
        m = _TAG_STOP.search(text, i)
        if m is None:
            return n
        q = m.start()
        if text[q] == ">":
            return q + 1
        if text[i:q].rstrip().endswith("="):
            close = text.find(text[q], q + 1)
            if close < 0:
                return n
            i = close + 1
        else:
            i = q + 1


def html_text(text: str, check: Callable[[int], None] | None = None) -> str:
    """The text of the HTML ``text``: line K holds the text found on line K of the source
    (trailing empty lines dropped), each piece's whitespace collapsed to single spaces.

    ``check``, when given, is called with the size of the text read so far every
    ``_CHECK_EVERY`` constructs, and may raise to stop reading (a budget of text or time)."""
    n = len(text)
    out: list[str] = []  # the lines read, up to line `done`
    done = 0  # how many lines of the source `out` holds
    size = 0  # how much text `out` holds
    current: list[tuple[str, bool]] = []  # the pieces of text on line `at`, in a <pre> or not
    at = 0
    skipping: list[str] = []
    pre = 0  # how many <pre> elements the scan is in: their text keeps its spaces
    line = 0  # the 0-based line of position `pos`
    pos = 0
    data_start = 0  # where the run of text being gathered began

    def put(k: int, piece: tuple[str, bool]) -> None:
        """Add a piece to line ``k``: lines come in order, so the line before it is complete."""
        nonlocal at, done, size
        if k != at:
            joined = _joined(current)
            if joined:
                out.append("\n" * (at - done) + joined + "\n")
                done, size = at + 1, size + len(joined)
            current.clear()
            at = k
        current.append(piece)

    def flush(end: int) -> None:
        nonlocal line, pos
        if end > data_start and not skipping:
            k = line + text.count("\n", pos, data_start)
            for n_, part in enumerate(text[data_start:end].split("\n")):
                if pre and part:
                    put(k + n_, (html.unescape(part).translate(_PRE_TEXT), True))
                elif part.strip():
                    words = " ".join(html.unescape(part).translate(_INVISIBLE).split())
                    if words:
                        put(k + n_, (words, False))
        line += text.count("\n", pos, end)
        pos = end

    steps = 0
    i = 0
    while i < n:
        lt = text.find("<", i)
        if lt < 0:
            break
        nxt = text[lt + 1 : lt + 2]
        if (nxt.isascii() and nxt.isalpha()) or (nxt == "/" and text[lt + 2 : lt + 3].isascii() and text[lt + 2 : lt + 3].isalpha()):
            closing = nxt == "/"
            start = lt + 2 if closing else lt + 1
            name_end = _TAG_NAME.match(text, start).end()
            name = text[start:name_end].lower()
            end = _tag_end(text, name_end)
            flush(lt)
            if name == "pre":
                pre = max(pre - 1, 0) if closing else pre + 1
            if closing:
                if name in skipping:
                    while skipping and skipping.pop() != name:
                        pass
            elif name in _RAW and not text[lt:end].rstrip(">").endswith("/"):
                m = _RAW_END[name].search(text, end)
                end = n if m is None else _tag_end(text, m.end() - 1)
            elif name in _SKIP and not text[lt:end].rstrip(">").endswith("/"):
                skipping.append(name)
        elif nxt == "!" and text.startswith("<!--", lt):
            flush(lt)
            if text.startswith("<!-->", lt) or text.startswith("<!--->", lt):
                end = lt + (5 if text[lt + 4] == ">" else 6)
            else:
                m = _COMMENT_END.search(text, lt + 4)
                end = n if m is None else m.end()
        elif nxt in ("!", "?") or (nxt == "/" and lt + 2 < n):
            flush(lt)  # a declaration, an instruction or a bogus end tag: markup up to ">"
            close = text.find(">", lt + 2)
            end = n if close < 0 else close + 1
        else:  # a "<" that opens nothing is text
            i = lt + 1
            continue
        line += text.count("\n", pos, end)
        pos = data_start = i = end
        steps += 1
        if check is not None and steps % _CHECK_EVERY == 0:
            check(size)
    flush(n)
    put(at + 1, ("", False))  # completes the last line
    return "".join(out)


def _joined(pieces: list[tuple[str, bool]]) -> str:
    """One line's pieces: text of a ``<pre>`` as it is, other pieces a space apart."""
    out = ""
    for piece, as_is in pieces:
        if as_is:
            out += piece
        elif out and not out[-1].isspace():
            out += " " + piece
        else:
            out += piece
    return out.rstrip()
