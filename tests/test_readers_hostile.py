"""Readers as a boundary: a document its library cannot read, or that would cost too much
time, memory or text, is one skipped file with one line saying why, and the run goes on.

Every hostile file is made here: damaged and encrypted PDFs through pypdf, zip-bomb DOCX
files through python-docx and zipfile, HTML that made the standard library's parser take
quadratic time, binary data named ``.html``.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crag.index import readers
from crag.index.readers import READERS, Reader, cached_text, read_document, reader_for
from tests.fakes import clean_env
from tests.test_readers import cli, make_docx, make_pdf

pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
pytest.importorskip("docx", reason="the docx extra (make install has it)")

ROOT = Path(__file__).resolve().parents[1]
PDF_READER = reader_for("x.pdf")
DOCX_READER = reader_for("x.docx")
HTML_READER = reader_for("x.html")


def damaged_pdf(path: Path) -> Path:
    """A PDF whose xref table lost a line break: pypdf raises ``TypeError`` (not its own error)."""
    make_pdf(path, [["Widget guide", "An introduction."], ["Page two."]])
    data = path.read_bytes()
    assert b"\nxref\n" in data
    path.write_bytes(data.replace(b"\nxref\n", b"\nxref/", 1))
    return path


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ok.md").write_text("# Harbour\n\nThe harbour shop opens at nine.\n", encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    return docs


def skipped(out: str) -> dict[str, str]:
    """The files an index run reports as skipped: path -> why."""
    found = re.findall(r"^  (docs/\S+): (.+)$", out, re.MULTILINE)
    return dict(found)


def test_a_damaged_pdf_is_one_skipped_file_and_the_good_file_beside_it_is_indexed(folder: Path) -> None:
    damaged_pdf(folder / "broken.pdf")
    with pytest.raises(TypeError):  # what pypdf itself does with it
        import pypdf

        pypdf.PdfReader(io.BytesIO((folder / "broken.pdf").read_bytes()))
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "1 added" in out and "docs/ok.md" in out
    why = skipped(out)
    assert list(why) == ["docs/broken.pdf"] and why["docs/broken.pdf"].startswith("pypdf cannot read it (TypeError")
    assert "\n" not in why["docs/broken.pdf"] and "Traceback" not in out + err
    code, out, _ = cli("search", "harbour shop", "--json")
    assert code == 0 and [h["path"] for h in json.loads(out)] == ["docs/ok.md"]


def test_no_mutation_of_a_valid_pdf_escapes_the_reader(tmp_path: Path) -> None:
    """Seeded byte mutations of a real PDF: each read gives text or a ``ValueError``, never
    another exception (pypdf raises TypeError, AttributeError, NotImplementedError... on some)."""
    good = make_pdf(tmp_path / "good.pdf", [["Widget guide", "An introduction."], ["Page two.", "The end."]]).read_bytes()
    rng = random.Random(37)
    outcomes = {"text": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            text = read_document(PDF_READER, bytes(data))
        except ValueError as exc:
            assert str(exc) and "\n" not in str(exc)
            outcomes["refused"] += 1
        else:
            assert isinstance(text, str)
            outcomes["text"] += 1
    assert outcomes["text"] and outcomes["refused"], outcomes
    # One of the seeds in the ones that broke the index run before: the same damage as above.
    with pytest.raises(ValueError, match=r"^pypdf cannot read it \(TypeError: "):
        read_document(PDF_READER, damaged_pdf(tmp_path / "b.pdf").read_bytes())


@pytest.mark.parametrize("error", [TypeError("bad"), AttributeError("x"), NotImplementedError(), RecursionError("deep"),
                                   KeyError("k"), MemoryError()])
def test_whatever_a_parser_raises_is_a_one_line_reason(error: Exception) -> None:
    def read(data: bytes) -> str:
        raise error

    with pytest.raises(ValueError) as caught:
        read_document(Reader("PDF", (".pdf",), "pypdf", "pdf", read), b"%PDF-1.4")
    reason = str(caught.value)
    assert "\n" not in reason and (type(error).__name__ in reason or "out of memory" in reason)


def test_pypdf_log_lines_never_reach_stderr(folder: Path) -> None:
    """A PDF with a wrong startxref offset: pypdf repairs it and logs so (on stderr, without
    crag's prefix, when nobody catches it). ``crag index`` reads it and prints nothing of pypdf's."""
    make_pdf(folder / "guide.pdf", [["Widget guide", "The widget needs a torque wrench."]])
    data = (folder / "guide.pdf").read_bytes()
    m = re.search(rb"startxref\n(\d+)", data)
    (folder / "guide.pdf").write_bytes(data[: m.start(1)] + str(int(m.group(1)) + 7).encode() + data[m.end(1) :])
    run = subprocess.run([sys.executable, "-m", "crag", "index", "docs"], cwd=folder.parent, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0 and "2 added" in run.stdout and not skipped(run.stdout), run.stdout + run.stderr
    assert run.stderr == ""
    _, out, _ = cli("search", "torque wrench", "--json")
    assert json.loads(out)[0]["path"] == "docs/guide.pdf"
    # Outside a reader, an application's own logging still receives pypdf's records, once.
    app = ("import logging, sys; logging.basicConfig(stream=sys.stdout, format='%(name)s: %(message)s')\n"
           "import crag.index.readers\nlogging.getLogger('pypdf._reader').warning('outside a reader')")
    run = subprocess.run([sys.executable, "-c", app], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.stdout == "pypdf._reader: outside a reader\n" and run.stderr == ""


def test_a_pdf_encrypted_with_an_empty_user_password_is_read_and_one_with_a_password_is_not(folder: Path) -> None:
    from pypdf import PdfReader, PdfWriter

    for name, user in (("open.pdf", ""), ("locked.pdf", "s3cret")):
        plain = make_pdf(folder / f"plain-{name}", [["Encrypted manual", f"The {name[:-4]} valve is blue."]])
        writer = PdfWriter(clone_from=PdfReader(plain))
        writer.encrypt(user_password=user, owner_password="owner", algorithm="AES-128")
        with open(folder / name, "wb") as f:
            writer.write(f)
        plain.unlink()
    code, out, _ = cli("index", "docs")
    assert code == 0 and "2 added" in out
    assert skipped(out) == {"docs/locked.pdf": "the PDF is encrypted with a password"}
    code, out, _ = cli("search", "open valve blue", "--json")
    assert "docs/open.pdf" in [h["path"] for h in json.loads(out)]


def test_a_pdf_named_as_the_root_and_skipped_for_its_content_is_named_as_in_a_folder(folder: Path) -> None:
    """A file crag may read but not index, named as the root itself (a PDF encrypted with a
    password), is skipped as it is in a folder: named with its reason, exit status 0. Only a
    root crag may not read at all is an error (docs/cli.md, "Roots")."""
    from pypdf import PdfReader, PdfWriter

    plain = make_pdf(folder / "plain.pdf", [["Encrypted manual", "The valve is blue."]])
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password="s3cret", owner_password="owner", algorithm="AES-128")
    with open(folder / "locked.pdf", "wb") as f:
        writer.write(f)
    code, out, err = cli("index", "docs/locked.pdf")
    assert code == 0 and skipped(out) == {"docs/locked.pdf": "the PDF is encrypted with a password"}, out + err
    code, _, err = cli("ask", "--kb", "docs/locked.pdf", "what", "colour", "is", "the", "valve?", "--json")
    assert code == 0 and "crag: skipped docs/locked.pdf: the PDF is encrypted with a password" in err.splitlines(), err
    assert err.count("docs/locked.pdf") == 1, err  # not said again as the agent's warning


def test_binary_data_named_html_is_skipped_as_binary(folder: Path) -> None:
    rng = random.Random(5)
    (folder / "dump.html").write_bytes(bytes(rng.randrange(256) for _ in range(200_000)))
    (folder / "controls.htm").write_bytes(bytes(rng.choice([1, 2, 3, 65, 66, 32]) for _ in range(50_000)))
    (folder / "page.html").write_text("<p>The harbour ferry leaves at ten.</p>\n", encoding="utf-8")
    (folder / "saved.html").write_bytes("<p>The night bus stops at the pier.</p>\r\n".encode("utf-16"))  # text
    code, out, _ = cli("index", "docs")
    assert code == 0 and "3 added" in out
    assert skipped(out) == {"docs/controls.htm": "binary data, not HTML", "docs/dump.html": "binary data, not HTML"}
    code, out, _ = cli("search", "night bus pier", "--json")
    assert json.loads(out)[0]["path"] == "docs/saved.html"


def test_a_pdf_over_the_page_limit_or_the_time_budget_is_refused_and_not_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pdf = make_pdf(tmp_path / "long.pdf", [["one"], ["two"], ["three"]])
    monkeypatch.setattr(readers, "MAX_PDF_PAGES", 2)
    with pytest.raises(ValueError, match=r"^it has 3 pages; crag reads PDFs of at most 2$"):
        read_document(PDF_READER, pdf.read_bytes())
    monkeypatch.setattr(readers, "MAX_PDF_PAGES", 2000)
    monkeypatch.setattr(readers, "TIME_BUDGET_SECONDS", -1.0)
    with pytest.raises(ValueError, match=r"^reading it took longer than -1 s$"):
        read_document(PDF_READER, pdf.read_bytes())
    monkeypatch.setattr(readers, "TIME_BUDGET_SECONDS", 60.0)

    # A refusal is remembered like a text: grep_search does not parse a damaged PDF again.
    import pypdf

    opened = []
    real = pypdf.PdfReader
    monkeypatch.setattr(pypdf, "PdfReader", lambda *a, **k: opened.append(1) or real(*a, **k))
    broken = damaged_pdf(tmp_path / "broken.pdf")
    for _ in range(3):
        with pytest.raises(ValueError, match="TypeError"):
            cached_text(str(broken), PDF_READER)
        assert cached_text(str(pdf), PDF_READER).startswith("one\n")
    assert len(opened) == 2


def test_the_time_budget_holds_while_pypdf_repairs_a_damaged_pdf(monkeypatch: pytest.MonkeyPatch) -> None:
    """pypdf parses every object of a PDF whose cross-reference table is wrong before it reads a
    page, and the time was checked only at a page's operators: a 52 MB file of small objects took
    100 s to be refused for taking longer than 60 s. The time is now checked as pypdf reads."""
    import pypdf

    objects = b"".join(b"%d 0 obj\n<< /Type /Page /Parent 2 0 R >>\nendobj\n" % n for n in range(3, 3000))
    data = (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n2 0 obj\n<< /Type /Pages /Kids [3 0 R] "
            b"/Count 1 >>\nendobj\n" + objects + b"trailer\n<< /Root 1 0 R >>\nstartxref\n123\n%%EOF\n")
    opened = []
    real = pypdf.PdfReader.__init__
    monkeypatch.setattr(pypdf.PdfReader, "__init__", lambda self, *a, **k: real(self, *a, **k) or opened.append(1))
    monkeypatch.setattr(readers, "TIME_BUDGET_SECONDS", -1.0)
    with pytest.raises(ValueError, match=r"^reading it took longer than -1 s$"):
        read_document(PDF_READER, data)
    assert not opened  # refused while pypdf was still repairing the file
    monkeypatch.setattr(readers, "TIME_BUDGET_SECONDS", 60.0)
    with pytest.raises(ValueError, match=r"^no text on its 1 page"):  # repaired, within the time
        read_document(PDF_READER, data)


def docx_with(path: Path, extra_xml: bytes) -> Path:
    """A real DOCX (python-docx) whose document.xml gets ``extra_xml`` before the body's end."""
    make_docx(path)
    with zipfile.ZipFile(path) as z:
        parts = {i.filename: z.read(i) for i in z.infolist()}
    parts["word/document.xml"] = parts["word/document.xml"].replace(b"<w:sectPr", extra_xml + b"<w:sectPr", 1)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in parts.items():
            z.writestr(name, data)
    return path


def paragraphs(text: str, n: int) -> bytes:
    return (f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>" * n).encode()


def test_docx_zip_bombs_are_refused_by_their_declared_sizes(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "MAX_DOCX_XML_BYTES", 2 * 1024 * 1024)  # 32 MiB in use: the same rule, smaller
    bomb = docx_with(folder / "bomb.docx", paragraphs("flange bolts " * 40, 3_000))  # 1.8 MiB in 50 KB
    noise = random.Random(1).randbytes(1_500_000).hex().encode()
    big = docx_with(folder / "big.docx", paragraphs("x", 1) + b"<!--" + noise + b"-->")  # 3 MB, not compressible
    fine = docx_with(folder / "fine.docx", paragraphs("The gearbox ships in March.", 3))
    assert bomb.stat().st_size < 50_000 and big.stat().st_size > 1_000_000 and fine.exists()
    code, out, _ = cli("index", "docs")
    assert code == 0 and "2 added" in out
    why = skipped(out)
    assert set(why) == {"docs/bomb.docx", "docs/big.docx"}
    assert re.fullmatch(r"its part word/document\.xml unpacks [\d,]+ times over \(a zip bomb\?\); crag allows 100 times",
                        why["docs/bomb.docx"]), why
    assert why["docs/big.docx"] == "its XML unpacks to 3.6 MiB; crag reads at most 2 MiB"


def docx_with_picture(path: Path, picture: bytes) -> Path:
    """A real DOCX whose body refers to the bitmap ``picture`` (as an inserted picture does),
    stored in the archive as it is."""
    make_docx(path)
    with zipfile.ZipFile(path) as z:
        parts = {i.filename: z.read(i) for i in z.infolist()}
    parts["[Content_Types].xml"] = parts["[Content_Types].xml"].replace(
        b"<Default Extension=", b'<Default Extension="bmp" ContentType="image/bmp"/><Default Extension=', 1)
    parts["word/_rels/document.xml.rels"] = parts["word/_rels/document.xml.rels"].replace(b"</Relationships>", (
        b'<Relationship Id="rIdPicture" Target="media/image1.bmp" '
        b'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image"/></Relationships>'))
    parts["word/media/image1.bmp"] = picture
    with zipfile.ZipFile(path, "w") as z:
        for name, data in parts.items():
            z.writestr(name, data)
    return path


def test_a_docx_is_read_from_its_xml_alone_never_unpacking_its_pictures(tmp_path: Path, monkeypatch) -> None:
    """python-docx unpacked every part a relationship reaches: a 28 MB DOCX holding 1.5 GiB of
    bitmap took 3.4 GB of memory and 23 s to index, and a picture damaged in the archive cost the
    document its text ("python-docx cannot read it (BadZipFile: Bad CRC-32 ...)")."""
    picture = b"BM" + bytes(4096)
    data = docx_with_picture(tmp_path / "report.docx", picture).read_bytes()
    unpacked: list[str] = []
    real_open = zipfile.ZipFile.open

    def open_part(self: zipfile.ZipFile, name: str | zipfile.ZipInfo, mode: str = "r", *args: object, **kwargs: object):
        info = name if isinstance(name, zipfile.ZipInfo) else self.getinfo(name)
        if mode == "r" and info.file_size:
            unpacked.append(info.filename)
        return real_open(self, name, mode, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", open_part)
    assert "The gearbox ships in March." in read_document(DOCX_READER, data)
    assert "word/document.xml" in unpacked and not [n for n in unpacked if not n.endswith((".xml", ".rels"))], unpacked
    at = data.index(picture)
    damaged = data[:at] + b"XX" + data[at + 2 :]  # the stored picture no longer matches its CRC
    assert "The gearbox ships in March." in read_document(DOCX_READER, damaged)


def test_every_reader_refuses_text_over_the_text_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "MAX_TEXT_BYTES", 4096)
    docx_bytes = docx_with(tmp_path / "long.docx", paragraphs("word " * 20, 100)).read_bytes()
    pdf_bytes = make_pdf(tmp_path / "long.pdf", [["word " * 20] * 20] * 3).read_bytes()
    html_bytes = ("<p>" + "word " * 2000 + "</p>").encode()
    for reader, data in ((DOCX_READER, docx_bytes), (PDF_READER, pdf_bytes), (HTML_READER, html_bytes)):
        with pytest.raises(ValueError, match=r"^its text is larger than "):
            read_document(reader, data)
    assert [r.name for r in READERS] == ["PDF", "DOCX", "HTML"]


HTML_TIMING = r"""
import sys, time
from crag.index.readers import read_document, reader_for

html = reader_for("x.html")
size = 300_000
start = time.monotonic()
read_document(html, ("<p>The harbour shop opens at nine.</p>\n" * (size // 40)).encode())
benign = time.monotonic() - start
for unit in ("<a ", "<![CDATA[", "<!--", "<a b=\"", "<script>", "</x", "<?", "<svg><a "):
    for tail in ("", ">", "-->", "]]>"):
        data = (unit * (size // len(unit)) + tail).encode()
        start = time.monotonic()
        try:
            read_document(html, data)
        except ValueError:  # no text in it: refused after it was read
            pass
        took = time.monotonic() - start
        if took > 2 + 50 * benign:
            sys.exit(f"{unit!r} x {size // len(unit)} + {tail!r}: {took:.1f}s, a benign file {benign:.2f}s")
"""


def test_hostile_html_is_read_in_linear_time() -> None:
    """300 KB of unterminated tags, comments or CDATA sections: html.parser re-scanned the rest
    of the file after each (quadratic: minutes). Each must read within a bound that only a
    blow-up exceeds (and the subprocess's timeout catches a hang)."""
    run = subprocess.run([sys.executable, "-c", HTML_TIMING], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_html_text_keeps_every_piece_on_its_source_line() -> None:
    read = HTML_READER.read
    assert read(b"<p>a &amp; b</p>\n<p>c&#10;d</p>") == "a & b\nc d\n"
    assert read(b'<a href="x>y">t</a>') == "t\n" and read(b"<a b='>'>q") == "q\n"
    assert read(b"a<3 b") == "a<3 b\n" and read(b"x <![CDATA[ y ]]> z") == "x z\n"
    assert read(b"<svg><text>x</text></svg>y<svg/>z") == "y z\n"
    assert read(b"<script>if (a<b) x</script>ok<STYLE>p{}</style >Z") == "ok Z\n"
    assert read(b"text <a unterminated") == "text\n" and read(b"x<!-- open comment") == "x\n"
    assert read(b"<p>\n\n  hello\n   world <i>x</i>y</p>\n\n") == "\n\nhello\nworld x y\n"
    # a line break an entity writes in a <pre> (as code highlighters do) moved every later line down one
    assert read(b"<pre>a&#10;b&#13;c</pre>\n<p>X</p>") == "a b c\nX\n"


def test_no_mutation_of_a_valid_docx_escapes_the_reader(tmp_path: Path) -> None:
    good = make_docx(tmp_path / "good.docx").read_bytes()
    rng = random.Random(15)
    refused = 0
    for _ in range(150):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            assert isinstance(read_document(DOCX_READER, bytes(data)), str)
        except ValueError as exc:
            assert str(exc) and "\n" not in str(exc)
            refused += 1
    assert refused


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>!-[]?/=\"' \nabpsvgcriptCDATA&#;x")), max_size=300))
def test_any_html_reads_into_at_most_its_own_lines(source: str) -> None:
    text = HTML_READER.read(source.encode())
    assert text == "" or text.endswith("\n")
    assert text.count("\n") <= source.count("\n") + 1


def test_a_document_removed_while_the_index_reads_it_is_one_skipped_file(folder: Path, monkeypatch) -> None:
    from crag.index import discover

    make_pdf(folder / "guide.pdf", [["Widget guide"]])
    real = discover.read_bytes

    def read_then_remove(path, *args):
        data = real(path, *args)
        if str(path).endswith(".pdf"):
            os.unlink(path)
        return data

    monkeypatch.setattr("crag.index.reading.read_bytes", read_then_remove)
    code, out, _ = cli("index", "docs")
    assert code == 0 and "docs/ok.md" in out
    assert skipped(out) == {"docs/guide.pdf": "cannot read (No such file or directory)"}


def pdf_with_unicode_map(path: Path, line: str, to_unicode: dict[str, str]) -> Path:
    """A one-page PDF showing ``line``, whose font's ToUnicode map reads each byte of
    ``to_unicode``'s keys as the UTF-16 code units of its value (hex): what a PDF producer
    writes, right or wrong, and pypdf decodes without checking."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    chars = "".join(f"<{ord(code):02X}> <{unit}>\n" for code, unit in to_unicode.items())
    cmap = DecodedStreamObject()
    cmap.set_data(
        (
            "/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /X def\n"
            f"1 begincodespacerange <00> <FF> endcodespacerange\n{len(to_unicode)} beginbfchar\n{chars}endbfchar\n"
            "endcmap CMapName currentdict /CMap defineresource pop end end\n"
        ).encode("ascii")
    )
    font = writer._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica"), NameObject("/ToUnicode"): writer._add_object(cmap),
    }))
    page = writer.add_blank_page(612, 792)
    stream = DecodedStreamObject()
    stream.set_data(f"BT /F1 12 Tf 72 720 Td ({line}) Tj ET".encode("latin-1"))
    page[NameObject("/Contents")] = writer._add_object(stream)
    page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
    with open(path, "wb") as f:
        writer.write(f)
    return path


def test_a_pdf_mapping_glyphs_to_nul_or_a_lone_surrogate_is_indexed_and_cited(folder: Path) -> None:
    # A broken ToUnicode map gives pypdf text holding U+0000 (PostgreSQL refuses it) and a lone
    # surrogate (no UTF-8 for it: SQLite's insert raised UnicodeEncodeError, a traceback that
    # lost the whole run). Both are what the page would show as unknown: U+FFFD, NUL dropped.
    pdf_with_unicode_map(folder / "odd.pdf", "The zorblax valve AB opens.", {"A": "D800", "B": "0000"})
    assert "\x00" in "".join(pdf_page_texts(folder / "odd.pdf"))  # what pypdf reads
    text = read_document(PDF_READER, (folder / "odd.pdf").read_bytes())
    assert "\x00" not in text and "\ufffd" in text
    text.encode("utf-8")  # every character has a UTF-8 form
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "2 added" in out and "Traceback" not in out + err
    code, out, err = cli("search", "zorblax valve", "--json")
    assert code == 0, err
    hit = json.loads(out)[0]
    assert hit["path"] == "docs/odd.pdf" and hit["page"] == 1 and hit["start_line"] == 1
    assert hit["text"] == "The zorblax valve \ufffd opens."


def pdf_page_texts(path: Path) -> list[str]:
    import pypdf

    return [page.extract_text() for page in pypdf.PdfReader(str(path)).pages]


def test_a_document_with_no_text_is_a_skipped_file_that_says_why(folder: Path) -> None:
    # A scanned PDF (pages of images, no text layer) was reported "added" and never found again:
    # nothing told the user that crag had read no word of it.
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(612, 792)
    writer.add_blank_page(612, 792)
    with open(folder / "scan.pdf", "wb") as f:
        writer.write(f)
    with open(folder / "nothing.pdf", "wb") as f:
        PdfWriter().write(f)
    (folder / "shell.html").write_text("<html><head><script>app()</script></head><body>\n</body></html>\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "1 added" in out and "docs/scan.pdf" not in out.split("skipped")[0]
    assert skipped(out) == {
        "docs/scan.pdf": "no text on its 2 pages: a scanned PDF holds images, and crag reads only a PDF's text (run OCR on it to index it)",
        "docs/nothing.pdf": "the PDF has no pages",
        "docs/shell.html": "no text in it",
    }
    code, out, _ = cli("roots")
    assert "docs  1 file, 1 chunk" in out


def blank_pdf(path: Path, pages: int = 2) -> Path:
    """A PDF of blank pages: what crag reads of a scan (its pages are images)."""
    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    with open(path, "wb") as f:
        writer.write(f)
    return path


SCAN = "no text on its 2 pages: a scanned PDF holds images, and crag reads only a PDF's text (run OCR on it to index it)"


def test_ask_and_search_with_kb_name_the_documents_they_skipped_and_why(folder: Path) -> None:
    """A folder of documents crag cannot read, asked about: the answer finds nothing, and stderr
    said nothing of why (exit status 0, the answer "couldn't find"). Each skipped file is named
    with its reason, on every run, as the index report names it; the exit status stays 0."""
    scans = folder.parent / "scans"
    scans.mkdir()
    blank_pdf(scans / "scan.pdf")
    damaged_pdf(scans / "broken.pdf")
    (folder / "bin.md").write_bytes(b"x\0\0\0 binary data named .md")
    for _ in range(2):
        code, out, err = cli("ask", "Which torque wrench does the widget need?", "--kb", "scans")
        assert code == 0 and "couldn't find" in out, err
        named = [line for line in err.splitlines() if line.startswith("crag: skipped ")]
        assert named[0].startswith("crag: skipped scans/broken.pdf: pypdf cannot read it (TypeError"), err
        assert named[1:] == [f"crag: skipped scans/scan.pdf: {SCAN}"], err
        code, out, err = cli("search", "torque wrench", "--kb", "scans")
        assert code == 0 and f"crag: skipped scans/scan.pdf: {SCAN}" in err.splitlines(), err
        # a run that finds the index current (nothing read) names them too
        code, out, err = cli("search", "harbour shop", "--kb", "docs")
        assert code == 0 and "docs/ok.md" in out and "crag: skipped docs/bin.md: binary file" in err.splitlines(), err


def test_every_skipped_file_is_named_by_index_and_ask_kb_says_how_to_see_them_all(folder: Path) -> None:
    """Past the tenth, skipped files were "... and 3 more": a scan among twelve damaged PDFs
    vanished with its reason, on every run. The index report names every one; ``--kb`` names
    ten on stderr and gives the command that names them all."""
    for n in range(12):
        (folder / f"report{n:02d}.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n")
    blank_pdf(folder / "zz-scan.pdf")
    for _ in range(2):
        code, out, err = cli("index", "docs")
        assert code == 0, err
        why = skipped(out)
        assert len(why) == 13 and why["docs/zz-scan.pdf"] == SCAN and "more" not in out, out
        assert "skipped 13 file(s):" in out.splitlines()
    code, out, err = cli("ask", "Which torque wrench does the widget need?", "--kb", "docs")
    assert code == 0
    named = [line for line in err.splitlines() if line.startswith("crag: skipped ")]
    assert len(named) == 10 and named[0].startswith("crag: skipped docs/report00.pdf: pypdf cannot read it ("), err
    assert "crag: ... and 3 more skipped file(s): `python -m crag index docs` names every one" in err.splitlines(), err


HIDDEN_CRYPTOGRAPHY = r"""
import importlib.abc, sys
class Hidden(importlib.abc.MetaPathFinder):  # as if the cryptography package were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "cryptography":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hidden())
from crag.index.readers import read_document, reader_for
try:
    read_document(reader_for("x.pdf"), open(sys.argv[1], "rb").read())
except ValueError as exc:
    print(exc)
"""


def test_an_aes_encrypted_pdf_without_the_cryptography_package_says_how_to_read_it(tmp_path: Path) -> None:
    """A PDF that opens without a password but restricts printing is usually encrypted with AES,
    which pypdf decrypts only with the cryptography package: the reason says how to get it."""
    from pypdf import PdfReader, PdfWriter

    plain = make_pdf(tmp_path / "plain.pdf", [["Restricted manual", "The ballast pump is blue."]])
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password="", owner_password="owner", algorithm="AES-256")
    with open(tmp_path / "aes.pdf", "wb") as f:
        writer.write(f)
    assert "ballast pump" in read_document(PDF_READER, (tmp_path / "aes.pdf").read_bytes())
    run = subprocess.run([sys.executable, "-c", HIDDEN_CRYPTOGRAPHY, str(tmp_path / "aes.pdf")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]
    assert run.stdout == ("the PDF is encrypted with AES, which pypdf reads with the cryptography package "
                          "(pip install cryptography)\n")
