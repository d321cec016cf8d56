"""What the offline answer quotes from an evidence text: sentences verbatim but for
whitespace, closed code blocks, and a code or settings file's lines as a code block.

``quotable`` yields (position, quote) for the sentences of a prose text worth quoting (not
markup-only lines, not a sentence repeating the question) and its closed code blocks; the
short title lines above a sentence (a PDF page's header) are a piece of their own
(``title_split``). ``code_file`` tells a file of code or settings by its name, and
``code_quotes`` quotes its lines around the best match, as written, in a code block.
Pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import pairwise

from .. import grounding, prompts
from ..state import EvidenceItem
from ..text import STOPWORDS, in_vocabulary, keywords
from .code_context import leading_code

__all__ = ["code_file", "code_quotes", "item_quotes", "quotable", "same_text", "table_excerpt", "title_split",
           "words_of"]

_CITE_LIKE = re.compile(r"\[(\s*\d+(?:\s*[-–,;]\s*\d+)*\s*)\]")
# A line that opens with a reference's label, as a numbered list of sources or footnotes writes
# it ("[3] Brown: the gateway listens on port 7431."): the label is the line's bullet.
_LABEL = re.compile(r"^[ \t]*" + _CITE_LIKE.pattern + r"[ \t]+(?=\S)", re.M)
_MAX_SENTENCE = 600


def words_of(sentence: str) -> str:
    """A sentence reduced to its words, to spot the same text quoted twice."""
    return " ".join(re.findall(r"[a-z0-9]+", sentence.lower()))


def same_text(a: str, b: str) -> bool:
    if len(a) < 20 or len(b) < 20:
        return a == b
    return a in b or b in a


_TAG = re.compile(r"</?([A-Za-z][\w-]*)[^<>]*>")
# HTML elements that lay out a page (or run a script) rather than mark a word in a sentence:
# a sentence holding one is markup ("<p align="center"> <img ...> </p> The gateway ...").
_LAYOUT_TAGS = frozenset("""
    address article aside audio blockquote body button canvas center col colgroup dd details dialog div dl dt
    embed fieldset figcaption figure font footer form frame h1 h2 h3 h4 h5 h6 head header hr html iframe img input
    label legend li link main meta nav noscript object ol optgroup option p param picture pre script section select
    source style summary svg table tbody td template textarea tfoot th thead title tr track ul video
""".split())
_HTML_ONLY = re.compile(r"<!--|<[A-Za-z][\w:-]*\s[^<>]*=[^<>]*$")  # a comment, or a tag cut at a full stop in it
# letters of scripts written without spaces between words: two of them count as a word
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f]")
_INLINE_CODE = re.compile(r"(`+)[^`\n]+?\1")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_ADMONITION = re.compile(r"^\s*(?:\[![A-Za-z]+\]|!!!|\?\?\?|:::|///|\{\*.*\*\}\s*$)")  # or an include: {* file *}
# A line that is only link reference definitions ([label]: url "title"), a template tag
# ({% include x %}, {{< shortcode >}}), an attribute list ({: #id .class}) or a reStructuredText
# directive with at most its one argument (".. code-block:: bash", ".. image:: logo.png", a
# substitution's ".. |logo| image:: logo.png") and the options on the lines below it
# ("   :caption: Rebuild the ledger", which made it a sentence of the file again), or a link
# target (".. _ledger-image:").
_DIRECTIVE = re.compile(
    r"^(?:(?:\s*\[[^\]]+\]:\s*<?\S+>?(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?)+"
    r"|\s*\{%.*%\}|\s*\{\{.*\}\}|\s*\{:.*\}|\s*\.\.[ \t]+(?:\|[^|\n]+\|[ \t]+)?[\w:.+-]+::(?:[ \t]+\S+)?"
    r"(?:\s+:[\w-]+:.*)?|\s*\.\.[ \t]+_[^:\n]+:(?:[ \t]+\S+)?)\s*$"
)
_QUOTE_PREFIX = re.compile(r"^[ \t]*(?:>[ \t]?)+", re.M)


_WRAP = re.compile(r"[ \t]*\n\s*")


def _one_line(text: str) -> str:
    """A sentence wrapped over lines put on one line; the spaces within a line (in inline
    code above all) are kept as written."""
    return _WRAP.sub(" ", text.strip())


def _markup_only(sentence: str) -> bool:
    """Whether a sentence is markup rather than prose: HTML, an admonition marker, an include
    directive (``{* file.py *}``), a link definition, a template tag, an attribute list, links only.
    Prose with a tag or two in it ("Press <kbd>Ctrl</kbd>+<kbd>S</kbd> to save.", "Start it with
    --port <PORT>.") is prose: the tags are markup only when they outweigh the text between them."""
    code_free = _INLINE_CODE.sub(" ", sentence)  # a `<tag>` in code is prose
    if _HTML_ONLY.search(code_free) or _CITE_LIKE.search(sentence):
        return True
    if _ADMONITION.match(sentence) or _DIRECTIVE.match(sentence):
        return True
    found = list(_TAG.finditer(code_free))
    if any(t.group(1).lower() in _LAYOUT_TAGS or (t.group(1).lower() == "a" and "href" not in t.group().lower())
           for t in found):  # an anchor without an address is a target: <a name="x"></a>
        return True
    tags = sum(len(t.group()) for t in found)
    prose = _LINK.sub(" ", _TAG.sub(" ", sentence))
    if tags and tags > len(" ".join(prose.split())):
        return True
    # three words, a number counting as one ("Port is 99"): a line of fewer is a label
    return len(re.findall(r"[^\W\d_]{2,}|\d+", prose)) + len(_UNSPACED.findall(prose)) // 2 < 3


def _code_block(text: str) -> str | None:
    """A fenced block as it should be quoted: list or quote indentation removed, or None
    when the block is not closed within the evidence."""
    lines = _QUOTE_PREFIX.sub("", text).split("\n")
    indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
    lines = [ln[indent:] for ln in lines]
    fence = lines[0].strip()[:3]
    if len(lines) < 3 or not lines[-1].strip().startswith(fence):
        return None
    return "\n".join(lines)


_TABLE_RULE = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?$")  # | --- | :---: |
_TABLE_ROWS = 12  # a table of at most this many lines is quoted whole
_TABLE_MATCHES = 3  # of a longer one, its header and at most this many rows holding the question's words


def _table(text: str, question: str) -> str | None:
    """A Markdown table as it should be quoted, its rows as written (list or quote indentation
    removed): whole when short, else its header and the rows that hold the most of the
    question's words (a word every row holds, as ``PUMP_`` of ``PUMP_TIMEOUT``, picks none of
    them: the first rows were quoted, not the asked one); None when it has no header rule, or
    no row of a long one holds them."""
    lines = [ln.strip() for ln in _QUOTE_PREFIX.sub("", text).split("\n")]
    if len(lines) < 3 or not _TABLE_RULE.match(lines[1]):
        return None
    if len(lines) <= _TABLE_ROWS and len(text) <= _CODE_CHARS:
        return "\n".join(lines)
    words = keywords(question)
    held = [sum(1 for w in words if in_vocabulary(w, set(keywords(row)))) for row in lines[2:]]
    most = max(held, default=0)
    if not most:
        return None
    rows = [row for row, n in zip(lines[2:], held, strict=True) if n == most]
    quote = "\n".join(lines[:2] + rows[:_TABLE_MATCHES])
    return quote if len(quote) <= _CODE_CHARS else None


def table_excerpt(quote: str, text: str) -> bool:
    """Whether ``quote``, a table quoted from ``text``, is some of its rows (``_table``: the
    header and the rows holding the most of the question's words), not the whole table."""
    lines = [ln.strip() for ln in _QUOTE_PREFIX.sub("", text).split("\n")] + [""]
    wanted = quote.split("\n")
    n = len(wanted)
    return not any(lines[i : i + n] == wanted and not lines[i + n].startswith("|") for i in range(len(lines) - n))


# A file with one of these suffixes (or none: README, LICENSE) is prose; any other file the
# index takes is code or settings, quoted as its lines in a code block (``code_quotes``).
_PROSE_SUFFIXES = frozenset(
    ".md .markdown .mdx .mdown .mkd .txt .text .rst .adoc .asciidoc .org .textile .tex .pdf .docx .html .htm".split()
)
_CODE_NAMES = frozenset("makefile dockerfile containerfile justfile procfile gemfile rakefile vagrantfile".split())
_CODE_WINDOW = 3  # lines quoted either side of a code file's best line
_CODE_WHOLE = 12  # a code item of at most this many lines is quoted whole
_CODE_CHARS = 1500  # the longest code block quoted


def code_file(item: EvidenceItem) -> bool:
    """Whether ``item`` comes from a file of code or settings (by its name), not prose."""
    if item.url or item.start_line is None:
        return False
    name = item.source.replace("\\", "/").rsplit("/", 1)[-1].lower()
    suffix = "." + name.rsplit(".", 1)[1] if "." in name.lstrip(".") else ""
    return name in _CODE_NAMES or (suffix != "" and suffix not in _PROSE_SUFFIXES)


# A file read as one line per paragraph (``crag.index.readers``): a line never runs on into
# the next, as a Markdown file's wrapped line does.
_LINE_PARAGRAPHS = frozenset({".docx"})

# Front matter: the metadata a site generator reads (Jekyll, Hugo, MkDocs), YAML between `---`
# lines (or closed by `...`) or TOML between `+++` lines, opening a file. Not prose to quote.
# Its first line must be a key: a file that opens with a `---` rule and prose is prose.
_FRONT_MATTER = re.compile(r"\A\ufeff?(?:---[ \t]*\n[ \t]*[A-Za-z_][\w.-]*[ \t]*:(?:[ \t].*)?\n(?:.*\n)*?(?:---|\.\.\.)"
                           r"|\+\+\+[ \t]*\n[ \t]*[A-Za-z_][\w.-]*[ \t]*[=:].*\n(?:.*\n)*?\+\+\+)[ \t]*(?:\n|\Z)")


def without_front_matter(text: str) -> str:
    """``text`` (a file's opening) with its front matter blanked: each of its characters but the
    line ends made a space, so every other sentence keeps its place and its line."""
    m = _FRONT_MATTER.match(text)
    if m is None:
        return text
    return re.sub(r"[^\n]", " ", m.group()) + text[m.end():]


def item_quotes(item: EvidenceItem, question: str = "", lead: str | None = None) -> Iterable[tuple[int, str]]:
    """``quotable`` for a prose item; in a DOCX, line by line (each line is a paragraph, list
    item or table row, so a heading or a bullet without a full stop is not quoted as the start
    of the sentence below it). The front matter a file opens with is left out."""
    name = item.source.replace("\\", "/").rsplit("/", 1)[-1].lower()
    if item.url or "." + name.rsplit(".", 1)[-1] not in _LINE_PARAGRAPHS:
        opening = item.start_line == 1 and not item.url  # a file's front matter is metadata, never quoted
        yield from quotable(without_front_matter(item.text) if opening else item.text, question, lead,
                            grounding.org_file(item))
        return
    pos = 0
    for line in item.text.split("\n"):
        for at, quote in quotable(line, question):
            yield pos + at, quote
        pos += len(line) + 1


def code_quotes(text: str, words: Sequence[str]) -> Iterable[tuple[int, str]]:
    """(position, block) for the text of a code or settings file: its lines around the one
    that holds most of ``words`` (the question's keywords), as written, in a code block."""
    lines = text.split("\n")
    hits = [sum(1 for w in words if in_vocabulary(w, set(keywords(line)))) for line in lines]
    if not any(hits):
        return
    best = hits.index(max(hits))
    code, lo = "", 0
    for width in (len(lines), _CODE_WINDOW, 0):  # the whole item when short, else fewer lines
        if width == len(lines) and len(lines) > _CODE_WHOLE:
            continue
        lo, hi = max(0, best - width), min(len(lines) - 1, best + width)
        while lo < best and not lines[lo].strip():
            lo += 1
        while hi > best and not lines[hi].strip():
            hi -= 1
        code = "\n".join(lines[lo : hi + 1])
        if len(code) <= _CODE_CHARS:
            break
    else:
        return
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    yield sum(len(line) + 1 for line in lines[:lo]), f"{fence}\n{code}\n{fence}"


_TITLE_WORDS = 4  # most words of a title line (a PDF page's header, a heading without #)


def title_split(text: str) -> list[tuple[int, int]]:
    """``text`` (a passage) as (start, end) parts: the title lines it opens with, then the
    sentence below them; or the whole text. A title line is short, has no closing
    punctuation, does not end in a word like "on" or "the", and the line below it opens with a
    capital letter; the split is made only when what follows is a sentence, ended by its full
    stop. A PDF page's header is then no part of the sentence below it, while a sentence
    wrapped over lines ("runs on" / "Linux and macOS.") and a list without bullets
    ("Monday closed" / "Saturday 10 to 14") stay one piece."""
    lines = text.split("\n")
    cut = 0
    for line, below in pairwise(lines):
        ws = line.split()
        if not 1 <= len(ws) <= _TITLE_WORDS or ws[-1][-1] in ".!?:;,-([{" or ws[-1].lower() in STOPWORDS:
            break
        if not below.lstrip()[:1].isupper():
            break
        cut += len(line) + 1
    if not cut or not _SENTENCE_END.search(text):
        return [(0, len(text))]
    return [(0, cut - 1), (cut, len(text))]


_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")


def _lines_too_long(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line of a passage too long to quote that is a sentence of its own
    (a capital first, a full stop last): lines without a full stop (settings, a log) run on
    into the sentence below them, and that sentence is still worth quoting."""
    if len(" ".join(text.split())) <= _MAX_SENTENCE:
        return []
    out, pos = [], 0
    for line in text.split("\n"):
        body = line.strip()
        if body[:1].isupper() and _SENTENCE_END.search(body):
            out.append((pos + len(line) - len(line.lstrip()), pos + len(line.rstrip())))
        pos += len(line) + 1
    return out


def _parts(text: str) -> list[tuple[int, int]]:
    """(start, end) of each part of a passage to quote (``title_split``, ``_lines_too_long``),
    each line that opens with a reference's label (``_LABEL``) cut from the text above it and
    quoted without its label, as a list item is quoted without its bullet: sentence ends were
    never read before such a label, so a list of sources ran on as one sentence, and a sentence
    holding a label is never quoted (every marker of the answer is crag's)."""
    labels = list(_LABEL.finditer(text))
    if not labels:
        return title_split(text) + _lines_too_long(text)
    cuts = [(0, labels[0].start())] + [(m.end(), n.start() if n else len(text))
                                       for m, n in zip(labels, [*labels[1:], None], strict=True)]
    out = []
    for a, b in cuts:
        part = text[a:b].rstrip()
        if part.strip():
            out += [(a + start, a + end) for start, end in title_split(part) + _lines_too_long(part)]
    return out


def _bare_row(piece: grounding.Passage) -> bool:
    """Whether ``piece`` is a table row written without a leading pipe (a DOCX table's row, "a |
    b | c"): quoted as written, as a line of a DOCX always was; a Markdown table is quoted whole."""
    return piece.kind == "table" and not _QUOTE_PREFIX.sub("", piece.text).startswith("|")


def quotable(text: str, question: str = "", lead: str | None = None, org: bool = False) -> Iterable[tuple[int, str]]:
    """(position, quote) for each sentence of ``text`` worth quoting, verbatim but for
    whitespace, and each closed code block; a sentence repeating the question (of three words
    or more, give or take three words: a FAQ line, a heading) is left out. A shorter question
    ("port") is a keyword, and the sentences holding it are the answer. ``lead`` is the fence
    line of the block the text starts inside of (``code_context``): those lines are code.
    ``org``: an Org file's text, whose markup lines (``#+BEGIN_QUOTE``, ``** Sub``) are never
    quoted (``grounding.passages``)."""
    echo = " ".join(question.lower().replace("'", " ").split()).strip(" ?!.")
    echo_words = len(echo.split()) if len(echo.split()) >= 3 else 0
    raw, skip = leading_code(text, lead)
    code = _code_block(raw) if raw is not None else None
    if code is not None and len(code) <= 1500:
        yield 0, code
    text = text[skip:]
    for piece in grounding.passages(text, org):
        if piece.kind not in ("sentence", "item") and not _bare_row(piece):  # prose, a list item's sentences
            continue
        for start, end in _parts(piece.text):
            sentence = _one_line(_QUOTE_PREFIX.sub("", piece.text[start:end]))
            if len(sentence) < 3 or len(sentence) > _MAX_SENTENCE or _markup_only(sentence):
                continue
            if "couldn't find relevant information" in sentence or prompts.strip_stats_blocks(sentence) != sentence:
                continue
            flat = " ".join(sentence.lower().replace("'", " ").split())
            if echo_words and echo in flat and len(flat.split()) <= echo_words + 3:
                continue
            yield skip + piece.start + start, sentence
    for piece in grounding.split(text):
        if piece.kind == "code":
            block = _code_block(piece.text)
            if block is not None and len(block) <= 1500:
                yield skip + piece.start, block
        elif piece.kind == "table":
            table = _table(piece.text, question)
            if table is not None:
                yield skip + piece.start, table
