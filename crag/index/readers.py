"""Documents that are not plain text, read as text: PDF, DOCX and HTML.

One record per reader: the suffixes it reads, the module it needs, the optional extra that
installs that module, and the function from the file's bytes to text. Discovery takes a
file with a reader's suffix when the reader's module can be imported, and otherwise counts
it among the files skipped for their type, with the ``pip install`` that includes them
(``skipped_line``). The text keeps crag's line numbers meaningful to a person:

* **PDF** (``pypdf``, extra ``pdf``): page after page, each starting at line
  ``(page - 1) * PAGE_LINES + 1`` (``crag.pages``), so a citation reads ``guide.pdf:p3:L12``:
  page 3, the 12th line of text on it, the values filled into its form fields after its text;
  ligatures ("ﬁ") read as their letters (``crag.index.pdf_text``). A PDF
  encrypted with an empty user password (one that opens without asking) is read; one that
  needs a password is not.
* **DOCX** (``python-docx``, extra ``docx``): one line per paragraph or table row, in the
  order of the document, so ``report.docx:L12`` is its 12th paragraph: hyperlinks, tracked
  insertions, fields and content controls included, a text box's paragraphs after the one
  that anchors it, a nested table in its cell's text (``crag.index.docx_text``); then the
  headers, footers, footnotes and endnotes, after the body. Word's macro-enabled documents and
  templates (``.docm``, ``.dotx``, ``.dotm``) are read alike; another package named ``.docx``
  (a workbook, an e-book, an old ``.doc``) is refused saying what it is. Only its XML is
  unpacked: its pictures, however large or damaged, never are.
* **HTML** (``crag.index.html_text``, in linear time): the text only (no tags, scripts or
  styles; entities decoded), each piece on the line it has in the HTML file, so
  ``page.html:L42`` opens the source where the text is.

A reader is a boundary (``read_document``): whatever its library raises, a text over
``MAX_TEXT_BYTES`` (checked as the text is read), a PDF of more than ``MAX_PDF_PAGES`` pages, a DOCX that unpacks to more
than ``MAX_DOCX_XML_BYTES`` (or at more than ``MAX_ZIP_RATIO`` to one), binary data named
``.html``, a Git LFS pointer in the file's place, a read that takes longer than
``TIME_BUDGET_SECONDS``, a document with no text (a scanned PDF): each is a ``ValueError``
with one line saying why, which the indexer reports as a skipped file and the tools as a
file they cannot read. The libraries' own log lines (pypdf logs what it repairs) are
caught while a reader runs, never printed; the last one joins the reason when the library
fails with an exception that is not one of its own errors. Texts already read, and
refusals, are kept for the process's life (keyed by path, size and modification time), so
``grep_search`` does not parse a PDF again for every search in one process.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import re
import threading
import time
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from attrs import frozen

from ..pages import PAGE_LINES
from ..safe_text import display_name
from .decoding import UTF16_BOMS, decode_text, utf16_codec, utf16_text, without_invisible
from .pdf_text import LIGATURES, OutOfTime, TimedBytes, form_values, joined_hyphens

__all__ = [
    "DISTRIBUTION", "MAX_DOCX_XML_BYTES", "MAX_PDF_PAGES", "MAX_TEXT_BYTES", "READERS", "UTF16_BOMS",
    "Reader", "cached_text", "decode_text", "extras_line", "read_document", "reader_for", "refuse_lfs_pointer", "skipped_line", "utf16_codec", "utf16_text",
]

# The name crag is installed under from the package index (the import name stays ``crag``).
DISTRIBUTION = "crag-kb"

MAX_TEXT_BYTES = 8 * 1024 * 1024  # the most text of one file: a text file's size, a document's text
MAX_PDF_PAGES = 2000  # pypdf needs about 1.5 ms and 80 KB a page: a longer PDF is refused
MAX_DOCX_XML_BYTES = 32 * 1024 * 1024  # what a DOCX's XML may unpack to (python-docx holds it all)
MAX_ZIP_RATIO = 100  # an XML part over 1 MiB unpacking to more than this many times its size: a zip bomb
TIME_BUDGET_SECONDS = 60.0  # a reader taking longer gives up (checked as pypdf reads, at each PDF operator, each DOCX paragraph)

# The loggers of the libraries readers use, caught while a reader runs.
_LIBRARY_LOGGERS = ("pypdf",)


@frozen
class Reader:
    name: str
    suffixes: tuple[str, ...]
    module: str | None  # what must be importable; None: the standard library
    extra: str | None  # the optional extra that installs it
    read: Callable[[bytes], str]

    def available(self) -> bool:
        return self.module is None or importlib.util.find_spec(self.module) is not None


class _Refused(ValueError):
    """A reader's own refusal: its message is the whole reason."""


class _Budget:
    """The text and time a reader may still spend on one file."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + TIME_BUDGET_SECONDS
        self.size = 0

    def add(self, text: str) -> None:
        """Count ``text`` as read; refuse the file once its text or its time is over the limit."""
        self.size += len(text)
        if self.size > MAX_TEXT_BYTES:
            raise _Refused(f"its text is larger than {_mib(MAX_TEXT_BYTES)}")
        self.check()

    def check(self, *_: object) -> None:
        """Refuse the file once its time is up (pypdf calls it for every operator of a page)."""
        if time.monotonic() > self.deadline:
            raise _Refused(f"reading it took longer than {TIME_BUDGET_SECONDS:g} s")


class _Caught(logging.Handler):
    """Keeps the log records of a thread that is running a reader; passes the others on.

    It is the one handler of the libraries' loggers, which no longer propagate: a record
    logged outside a reader goes on to the root logger's handlers, as it did before."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        kept = getattr(self.local, "records", None)
        if kept is None:
            logging.getLogger().callHandlers(record)
            return
        try:
            kept.append(record.getMessage())
        except Exception:  # a library's malformed log call (the "--- Logging error ---" blocks)
            kept.append(str(record.msg))


_CAUGHT = _Caught()
for _name in _LIBRARY_LOGGERS:
    logging.getLogger(_name).addHandler(_CAUGHT)
    logging.getLogger(_name).propagate = False


@contextmanager
def _caught_logs() -> Iterator[list[str]]:
    """The messages the readers' libraries log in this thread meanwhile."""
    outer = getattr(_CAUGHT.local, "records", None)
    _CAUGHT.local.records = records = []
    try:
        yield records
    finally:
        _CAUGHT.local.records = outer


def _one_line(text: str, limit: int = 200) -> str:
    words = " ".join(str(text).split())
    return words if len(words) <= limit else words[: limit - 3] + "..."


# What a clone made without Git LFS's files holds in place of each: a pointer of a few lines of text.
_LFS_POINTER = re.compile(rb"version https://git-lfs\.github\.com/spec/v\d+\n")


def refuse_lfs_pointer(data: bytes) -> None:
    """``ValueError`` when ``data`` is a Git LFS pointer (a document's or a text file's: a CSV's,
    whose pointer would be indexed as its text): no parser's error can say what it is."""
    if len(data) < 1024 and _LFS_POINTER.match(data):
        raise ValueError("it is a Git LFS pointer, not the file itself: run git lfs pull to fetch it")


def read_document(reader: Reader, data: bytes) -> str:
    """``reader.read(data)`` behind the boundary (see the module docstring): its text, or
    ``ValueError`` with one line saying why not."""
    refuse_lfs_pointer(data)
    with _caught_logs() as logged:
        try:
            text = reader.read(data)
        except _Refused:
            raise
        except MemoryError:
            raise ValueError(f"the {reader.name} reader ran out of memory") from None
        except Exception as exc:  # a parser's bug is this file's problem, never the run's
            said = f"; {reader.module or reader.name} logged: {_one_line(logged[-1], 120)}" if logged else ""
            reason = _one_line(f"{type(exc).__name__}: {exc}") if str(exc) else type(exc).__name__
            raise ValueError(f"{reader.module or reader.name} cannot read it ({reason}{said})") from exc
    text = _storable(text)
    if not text.strip():  # nothing in it could ever be found: named as skipped, not reported added
        raise ValueError("no text in it")
    if len(text) - text.count("\n") > MAX_TEXT_BYTES // 4 and _text_bytes(text) > MAX_TEXT_BYTES:
        raise ValueError(f"its text is larger than {_mib(MAX_TEXT_BYTES)}")
    return text


def _storable(text: str) -> str:
    """A document's text as every store keeps it: NUL dropped (PostgreSQL refuses it in text, and
    ``decode_text`` drops it from text files), a surrogate pair joined into its character and a
    lone surrogate (a PDF's ToUnicode map may name one; it has no UTF-8 form, so SQLite cannot
    store it) read as U+FFFD, the character a reader shows for one it cannot show; soft hyphens and
    zero-width spaces (a DOCX run's text pasted from a web page, a PDF font's map) dropped, as a
    text file drops them (``without_invisible``), for they split the word they sit in."""
    text = without_invisible(text)
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _text_bytes(text: str) -> int:
    """The size of a document's text in UTF-8, line breaks not counted (a PDF's blank page lines)."""
    return len(text.encode("utf-8", "surrogatepass")) - text.count("\n")


def _pdf(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

    if not data:
        raise _Refused("the file is empty")
    budget = _Budget()
    try:
        reader = PdfReader(TimedBytes(data, budget.deadline))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # an empty user password: it opens without asking
            except (FileNotDecryptedError, NotImplementedError):
                opened = 0
            if not opened:
                raise _Refused("the PDF is encrypted with a password")
        count = len(reader.pages)
        if count > MAX_PDF_PAGES:
            raise _Refused(f"it has {count:,} pages; crag reads PDFs of at most {MAX_PDF_PAGES:,}")
        pages = []
        for page in reader.pages:
            text = page.extract_text(visitor_operand_before=budget.check) or ""
            values = form_values(page, text)
            if values:
                text = "\n".join([*([text.rstrip("\n")] if text.strip() else []), *values])
            pages.append(text.translate(LIGATURES))
            budget.add(pages[-1])
    except PyPdfError as exc:
        other = _sniffed(data)
        if other is not None and other[1] != ".pdf":  # a download's error page saved as .pdf, say
            raise _Refused(f"it is not a PDF but {other[0]}{_renamed(other)}") from exc
        if b"%PDF-" not in data[:1024]:  # pypdf reads a PDF with a header that late, or none, but not this one
            raise _Refused("it is not a PDF (it does not start with %PDF-, as a PDF does)") from exc
        cut = ": the PDF is cut short, with no %%EOF at its end (copy it again)" if b"%%EOF" not in data else ""
        raise _Refused(f"pypdf cannot read it ({_one_line(exc)}){cut}") from exc
    except OutOfTime:  # pypdf spent the time reading the file, before any page's operators
        raise _Refused(f"reading it took longer than {TIME_BUDGET_SECONDS:g} s") from None
    except DependencyError as exc:
        if "AES" not in str(exc):
            raise
        raise _Refused("the PDF is encrypted with AES, which pypdf reads with the cryptography package "
                       "(pip install cryptography)") from exc
    if not any(text.strip() for text in pages):
        raise _Refused(f"no text on its {len(pages)} page{'s' * (len(pages) > 1)}: a scanned PDF holds images, and "
                       "crag reads only a PDF's text (run OCR on it to index it)" if pages else "the PDF has no pages")
    out: list[str] = []
    for text in pages:
        lines = joined_hyphens([line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")])
        if len(lines) > PAGE_LINES:  # keep every word, on the page's last line (the chunker cuts it)
            lines[PAGE_LINES - 1 :] = [" ".join(lines[PAGE_LINES - 1 :])]
        out += lines + [""] * (PAGE_LINES - len(lines))
    last_page = (len(pages) - 1) * PAGE_LINES + 1  # the last page's first line: a blank last page is still a page
    while len(out) > last_page and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n" if out else ""


_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # the signature of an OLE compound file


def _check_zip(data: bytes) -> zipfile.ZipFile:
    """The zip archive of a DOCX; refused when its parts would unpack past ``MAX_DOCX_XML_BYTES``
    or at a bomb's ratio, by the sizes its zip directory declares (zipfile never unpacks more
    than declared)."""
    if not data:
        raise _Refused("the file is empty")
    if data.startswith(_OLE):  # Word's own container: a .doc, or a DOCX encrypted with a password
        if "EncryptedPackage".encode("utf-16-le") in data:
            raise _Refused("the DOCX is encrypted with a password")
        raise _Refused("it is not a DOCX but a Word 97-2003 document (.doc): save it as .docx to index it")
    other = _sniffed(data)
    if other is not None and other[1] != ".docx":
        raise _Refused(f"it is not a DOCX but {other[0]}{_renamed(other)}")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        parts = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
        if data.startswith(b"PK\x03\x04"):  # a zip archive's start, no directory: a partial copy, say
            raise _Refused(f"the DOCX is damaged or cut short (its zip archive cannot be opened: {_one_line(exc)})") from exc
        raise _Refused(f"it is not a DOCX (not a zip archive: {_one_line(exc)})") from exc
    names = {p.filename: p for p in parts}
    if "[Content_Types].xml" not in names and _wordish(names):
        raise _Refused("the DOCX is damaged (its part [Content_Types].xml is missing)")
    if "[Content_Types].xml" not in names:  # no Office package: an e-book, an OpenDocument, any zip
        kind = names.get("mimetype")
        mimetype = _one_line(zf.read(kind)[:100].decode("ascii", "replace"), 80) if kind and kind.file_size <= 100 else ""
        raise _Refused(f"it is not a DOCX but a zip archive {f'of {mimetype}' if mimetype else 'with no Word document in it'}")
    for p in parts:  # only the XML is unpacked (``_xml_only``)
        if _is_xml(p.filename) and p.file_size > 1024 * 1024 and p.file_size > MAX_ZIP_RATIO * max(p.compress_size, 1):
            raise _Refused(f"its part {_one_line(p.filename, 80)} unpacks {p.file_size // max(p.compress_size, 1):,} "
                           f"times over (a zip bomb?); crag allows {MAX_ZIP_RATIO} times")
    xml = sum(p.file_size for p in parts if _is_xml(p.filename))
    if xml > MAX_DOCX_XML_BYTES:
        raise _Refused(f"its XML unpacks to {_mib(xml)}; crag reads at most {_mib(MAX_DOCX_XML_BYTES)}")
    return zf


def _wordish(names: Iterable[str]) -> bool:
    """Whether a zip holding ``names`` has Word's parts (its ``word/`` folder): a DOCX, if a damaged one."""
    return any(name.startswith("word/") for name in names)


# python-docx's error for a part a package's relationships name and its zip archive lacks (zipfile's).
_NO_PART = re.compile(r"There is no item named '(.*)' in the archive")


def _is_xml(name: str) -> bool:
    return name.lower().endswith((".xml", ".rels"))


def _xml_only(zf: zipfile.ZipFile) -> bytes:
    """The package of ``zf`` with every part but its XML emptied: python-docx unpacks every part a
    relationship reaches, and a DOCX's images may unpack to gigabytes (a 28 MB file held 1.5 GiB
    of bitmap); crag reads only the XML, at most ``MAX_DOCX_XML_BYTES`` of it."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as kept:  # stored: compressing again would cost more than it saves
        for name in dict.fromkeys(zf.namelist()):
            kept.writestr(name, zf.read(name) if _is_xml(name) else b"")
    return out.getvalue()


_HTML_START = re.compile(rb"\s*<(?:!doctype\s+html|html|head|body)\b", re.IGNORECASE)


def _sniffed(data: bytes) -> tuple[str, str] | None:
    """What a file is by its first bytes, as (what, its suffix), when it is a PDF, a DOCX or an
    HTML page, for a reader that finds another format under its suffix; else None."""
    if data.lstrip()[:5] == b"%PDF-":
        return "a PDF", ".pdf"
    if data.startswith(b"PK\x03\x04") and b"word/document.xml" in data:
        return "a DOCX", ".docx"
    if _HTML_START.match(data[:1024]):
        return "an HTML page", ".html"
    return None


def _renamed(kind: tuple[str, str]) -> str:
    """How to index a file that is a document crag reads under another suffix (a page is not
    named: a page saved as .pdf is most often a download's error page)."""
    return f": rename it to {kind[1]} to index it" if kind[1] != ".html" else ""


def _mib(size: int) -> str:
    """``32 MiB``, ``2.5 MiB``: a size as limits are stated."""
    return f"{size / (1024 * 1024):.1f}".removesuffix(".0") + " MiB"


def _strict_word(zf: zipfile.ZipFile) -> bool:
    """Whether ``zf`` is a Word document in ISO 29500 Strict, whose relationships python-docx
    does not know (Word's "Strict Open XML Document", saved as .docx)."""
    names = zf.namelist()
    return ("_rels/.rels" in names and "[Content_Types].xml" in names
            and b"purl.oclc.org/ooxml/officeDocument/relationships/officeDocument" in zf.read("_rels/.rels")
            and b"wordprocessingml" in zf.read("[Content_Types].xml"))


def _docx(data: bytes) -> str:
    from docx.oxml import parse_xml
    from docx.package import Package

    from .docx_text import PARTS, blocks, not_word

    zf = _check_zip(data)
    budget = _Budget()
    try:
        package = Package.open(io.BytesIO(_xml_only(zf)))
        main = package.main_document_part
    except KeyError as exc:  # a zip of Office parts whose package names no main document, or lacks a part
        if _strict_word(zf):
            raise _Refused("it is a Word document saved as Strict Open XML, which python-docx cannot read: "
                           "save it as a Word Document (.docx) to index it") from exc
        named = _NO_PART.search(str(exc))  # a part its relationships name, its styles or a header, say
        names = zf.namelist()
        missing = named[1] if named else "_rels/.rels" if "_rels/.rels" not in names and _wordish(names) else None
        if missing is not None:
            raise _Refused(f"the DOCX is damaged (its part {_one_line(missing, 80)} is missing)") from exc
        raise _Refused("it is not a DOCX but a zip archive with no Word document in it") from exc
    except Exception as exc:  # python-docx raises zipfile, lxml and its own errors alike
        raise _Refused(f"python-docx cannot read it ({_one_line(f'{type(exc).__name__}: {exc}')})") from exc
    other = not_word(main.content_type)
    if other:
        raise _Refused(f"it is not a DOCX but {other}")
    # A macro-enabled document or a template is Word's too: its main part is read from its XML.
    element = getattr(main, "element", None)
    lines: list[str] = []
    blocks((element if element is not None else parse_xml(main.blob)).body, lines, budget)
    # Headers, footers, footnotes and endnotes follow the body, each part once, so the
    # body's line numbers are the same whether a document has them or not.
    seen: set[str] = set()
    for kind in PARTS:
        for rel in main.rels.values():
            if rel.is_external or not rel.reltype.endswith("/" + kind) or rel.target_ref in seen:
                continue
            seen.add(rel.target_ref)
            element = getattr(rel.target_part, "element", None)
            if element is None:  # a part python-docx does not parse itself (footnotes, endnotes)
                element = parse_xml(rel.target_part.blob)
            blocks(element, lines, budget)
    return "\n".join(lines) + "\n" if lines else ""


def _html(data: bytes) -> str:
    from .html_text import html_text

    other = _sniffed(data)
    if other is not None and other[1] != ".html":  # a PDF saved under a download page's name
        raise _Refused(f"it is not HTML but {other[0]}{_renamed(other)}")
    if utf16_text(data) is None and _looks_binary(data):  # UTF-16 with its BOM holds NUL bytes
        raise _Refused("binary data, not HTML")
    budget = _Budget()

    def check(size: int) -> None:  # a page may be 128 MiB of markup: its text and time are checked as it is read
        if size > MAX_TEXT_BYTES:
            raise _Refused(f"its text is larger than {_mib(MAX_TEXT_BYTES)}")
        budget.check()

    return html_text(_html_decoded(data), check)


def _html_decoded(data: bytes) -> str:
    """A page's text in the character set it declares (``html_text.declared_codec``); a byte
    order mark, a declaration of UTF-8, none at all, UTF-8 beyond ASCII, or bytes the declared
    set cannot decode (a UTF-8 page whose template still says Latin-1) are read as every text
    file is."""
    from .html_text import declared_codec

    codec = None if data.startswith((b"\xef\xbb\xbf", *UTF16_BOMS)) else declared_codec(data)
    if codec not in (None, "utf-8"):
        try:
            data.decode("utf-8")
            utf8 = not data.isascii()  # seven bits are any ASCII-based set's, and ISO-2022's escapes
        except UnicodeDecodeError:
            utf8 = False
        if not utf8:
            try:
                text = data.replace(b"\x00", b"").decode(codec)
            except UnicodeDecodeError:
                return decode_text(data)
            return text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    return decode_text(data)


def _looks_binary(data: bytes) -> bool:
    """A NUL byte, or more than one byte in 20 a control character, in the first 8 KiB."""
    head = data[:8192]
    if b"\x00" in head:
        return True
    controls = sum(head.count(bytes([c])) for c in range(32) if c not in (9, 10, 12, 13, 27))
    return controls * 20 > len(head)


READERS: tuple[Reader, ...] = (
    Reader("PDF", (".pdf",), "pypdf", "pdf", _pdf),
    Reader("DOCX", (".docx", ".docm", ".dotx", ".dotm"), "docx", "docx", _docx),
    Reader("HTML", (".html", ".htm", ".xhtml"), None, None, _html),
)
_BY_SUFFIX = {suffix: r for r in READERS for suffix in r.suffixes}


def reader_for(name: str) -> Reader | None:
    """The reader of a file name's suffix, or None for text read as it is."""
    _, dot, suffix = name.lower().rpartition(".")
    return _BY_SUFFIX.get("." + suffix) if dot else None


_CACHE: OrderedDict[tuple[str, int, int], str | ValueError] = OrderedDict()
_CACHE_BYTES = 64 * 1024 * 1024
_cached_bytes = 0
_cache_lock = threading.Lock()


def cached_text(path: str, reader: Reader, data: bytes | None = None) -> str:
    """The text of the document at ``path``, read once per (path, size, mtime) in a process.

    Raises ``OSError`` when it cannot be read and ``ValueError`` when its reader cannot make
    text of it (a refusal is kept as a text is, so a damaged PDF is not parsed again)."""
    global _cached_bytes
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _cache_lock:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
    if isinstance(found, ValueError):
        raise ValueError(str(found))
    if found is not None:
        return found
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    try:
        text: str | ValueError = read_document(reader, data)
    except ValueError as exc:
        text = ValueError(str(exc))
    with _cache_lock:
        _CACHE[key] = text
        _cached_bytes += len(text) if isinstance(text, str) else 100
        while _cached_bytes > _CACHE_BYTES and len(_CACHE) > 1:
            _, old = _CACHE.popitem(last=False)
            _cached_bytes -= len(old) if isinstance(old, str) else 100
    if isinstance(text, ValueError):
        raise ValueError(str(text))
    return text


def extras_line(suffixes: Iterable[str], command: str = "pip install") -> str | None:
    """``skipped_line`` of the files an extra that is not installed would read, or None: what
    ``ask`` and ``search --kb`` say on every run, since the answer cannot say why it missed them."""
    return skipped_line([s for s in suffixes if (r := _BY_SUFFIX.get(s)) is not None and not r.available()], command)


def skipped_line(suffixes: Iterable[str], command: str = "pip install", kept: int = 0) -> str | None:
    """One line for the files left out for their type: how many of each, how to include
    those a reader could read, and how many of those stay indexed from an earlier run
    (``kept``); ``None`` when none was left out."""
    counts = Counter(suffixes)
    if not counts:
        return None
    # a suffix is part of a file's name: escaped as names are, so a newline in it adds no line
    shown = ", ".join(f"{n} {display_name(s) if s else 'no suffix'}" for s, n in counts.most_common(6))
    more = len(counts) - 6
    line = f"skipped by type: {shown}{f' and {more} more types' if more > 0 else ''}"
    extras = sorted({r.extra for s in counts if (r := _BY_SUFFIX.get(s)) is not None and r.extra and not r.available()})
    if extras:
        stay = f"; the {kept} indexed earlier stay in the index as they were" if kept else ""
        line += f" (to include them: {command} '{DISTRIBUTION}[{','.join(extras)}]'{stay})"
    return line
