"""Documents as people keep them: PDF (cited by page and line), DOCX and HTML read as text,
files skipped for their type counted with how to include them, and ``.gitignore`` /
``.cragignore`` / ``--exclude`` respected. The PDF and DOCX files are made here, by the same
libraries that read them (pypdf, python-docx: the ``pdf`` and ``docx`` extras)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from crag.cli import main
from crag.index.discover import discover
from crag.index.readers import READERS, reader_for, skipped_line
from crag.pages import PAGE_LINES, line_ref, page_line, span_ref
from tests.fakes import clean_env

pypdf = pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
docx = pytest.importorskip("docx", reason="the docx extra (make install has it)")


def make_pdf(path: Path, pages: list[list[str]]) -> Path:
    """A PDF whose pages hold these lines of text (Helvetica, one text object a page)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = writer._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica"),
    }))
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        ops += ["(" + line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ") Tj T*" for line in lines]
        stream = DecodedStreamObject()
        stream.set_data("\n".join([*ops, "ET"]).encode("latin-1"))
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
    with open(path, "wb") as f:
        writer.write(f)
    return path


def make_docx(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Parts report", 1)
    document.add_paragraph("The gearbox ships in March.")
    table = document.add_table(rows=2, cols=2)
    for (r, c), text in {(0, 0): "Part", (0, 1): "Count", (1, 0): "flange bolts", (1, 1): "12"}.items():
        table.cell(r, c).text = text
    document.add_paragraph("Flange bolts are zinc plated.")
    document.save(path)
    return path


HTML = """<!doctype html>
<html><head><title>Widgets</title>
<style>p { color: red }</style></head>
<body>
<p>Widgets &amp; gadgets are
<b>sold</b> at the harbour shop.</p>
<script>var hidden = "never indexed";</script>
</body></html>
"""


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    make_pdf(docs / "guide.pdf", [
        ["Widget guide", "An introduction to the widget."],
        ["Installation steps follow.", "The widget needs a torque wrench.", "Tighten every flange to forty newton metres."],
    ])
    make_docx(docs / "report.docx")
    (docs / "shop.html").write_text(HTML, encoding="utf-8")
    (docs / "notes.md").write_text("# Notes\n\nThe harbour shop opens at nine.\n", encoding="utf-8")
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    return docs


def test_each_reader_keeps_lines_a_person_can_find() -> None:
    assert [r.name for r in READERS] == ["PDF", "DOCX", "HTML"] and reader_for("A.PDF").name == "PDF"
    assert reader_for("notes.md") is None
    html = reader_for("x.html").read(HTML.encode()).split("\n")
    assert html[1] == "Widgets" and html[4] == "Widgets & gadgets are" and html[5] == "sold at the harbour shop."
    assert "never indexed" not in "\n".join(html) and "color" not in "\n".join(html)
    assert page_line(1) == (1, 1) and page_line(PAGE_LINES + 3) == (2, 3) and line_ref("a/Guide.PDF", 2 * PAGE_LINES + 12) == "p3:L12"
    assert line_ref("docs/a.md", 42) == "L42"
    assert span_ref("a.md", 3, 9) == "L3-L9" and span_ref("g.pdf", PAGE_LINES + 1, PAGE_LINES + 7) == "p2:L1-L7"
    assert span_ref("g.pdf", PAGE_LINES + 40, 2 * PAGE_LINES + 5) == "p2:L40-p3:L5"


def test_a_folder_of_pdf_docx_html_and_markdown_is_indexed_and_cited_by_page_and_line(kb: Path) -> None:
    code, out, _ = cli("index", "docs")
    assert code == 0 and "4 added" in out
    assert "skipped by type: 1 .png" in out and "pip install" not in out  # nothing that an extra would read

    code, out, _ = cli("ask", "Which torque wrench does the widget need?", "--json")
    result = json.loads(out)
    pdf = [c for c in result["citations"] if c["path"] == "docs/guide.pdf"]
    assert pdf and pdf[0]["page"] == 2 and pdf[0]["line"] == 2
    assert "[1] docs/guide.pdf:p2:L2" in result["answer"] or "docs/guide.pdf:p2:L2" in result["answer"]

    code, out, _ = cli("ask", "How many flange bolts are in the parts report?", "--json")
    cited = {(c["path"], c["line"]) for c in json.loads(out)["citations"]}
    # Line K of a DOCX is its Kth paragraph or table row: 3-4 the table, 5 the paragraph on bolts.
    assert any(path == "docs/report.docx" and 3 <= line <= 5 for path, line in cited), cited

    code, out, _ = cli("search", "harbour shop widgets gadgets", "--json")
    hits = {h["path"]: h for h in json.loads(out)}
    assert hits["docs/shop.html"]["start_line"] <= 5 and "<p>" not in hits["docs/shop.html"]["text"]

    code, out, _ = cli("ask", "Which torque wrench does the widget need?")
    assert "docs/guide.pdf:p2:L2" in out
    code, out, _ = cli("search", "torque wrench")
    assert "docs/guide.pdf:p2:L1-L3  score" in out
    # search --json states the same place: page 2, lines 1-3 of it (not crag's internal 1001-1003).
    code, out, _ = cli("search", "torque wrench harbour shop", "--json", "--top-k", "5")
    hit = next(h for h in json.loads(out) if h["path"] == "docs/guide.pdf")
    assert list(hit) == ["path", "page", "start_line", "end_line", "score", "text"]
    assert (hit["page"], hit["start_line"], hit["end_line"]) == (2, 1, 3) and "torque wrench" in hit["text"]
    assert "page" not in next(h for h in json.loads(out) if h["path"] != "docs/guide.pdf")


def test_files_a_missing_extra_would_read_are_counted_with_the_install_line(kb: Path, monkeypatch) -> None:
    from crag.index import readers

    monkeypatch.setattr(readers.Reader, "available", lambda self: self.module is None)
    found = discover([str(kb)])
    assert sorted(found.skipped_types) == [".docx", ".pdf", ".png"]
    line = skipped_line(found.skipped_types)
    assert line.startswith("skipped by type: ") and "1 .pdf" in line and "1 .docx" in line
    assert line.endswith("(to include them: pip install 'crag-kb[docx,pdf]')")
    assert skipped_line([]) is None


def test_documents_indexed_earlier_stay_when_their_extra_is_missing_now(kb: Path, monkeypatch) -> None:
    """An index run in an environment without pypdf or python-docx (another virtualenv, an
    uninstalled extra) cannot read them, but they are still there: their chunks stay, as a root
    that cannot be reached now keeps its files, and installing the extra again re-reads nothing."""
    from crag.index import readers

    code, out, _ = cli("index", "docs")
    assert code == 0 and "4 added" in out
    with monkeypatch.context() as m:
        m.setattr(readers.Reader, "available", lambda self: self.module is None)
        code, out, _ = cli("index", "docs")
        assert code == 0 and "0 removed" in out and "removed:" not in out, out
        line = next(x for x in out.splitlines() if x.startswith("skipped by type: "))
        assert line.endswith("(to include them: pip install 'crag-kb[docx,pdf]'; "
                             "the 2 indexed earlier stay in the index as they were)"), line
        code, out, _ = cli("search", "torque wrench", "--json")
        assert "docs/guide.pdf" in [h["path"] for h in json.loads(out)]
    code, out, _ = cli("index", "docs")
    assert code == 0 and "0 added" in out and "5 unchanged" not in out and "4 unchanged" in out, out


def test_read_file_of_a_document_whose_extra_is_missing_now_names_the_extra(kb: Path, monkeypatch) -> None:
    """A PDF indexed earlier stays evidence where pypdf is missing now (an MCP server in its own
    virtualenv, say), so search cites it; read_file of that file said it "is not part of the
    knowledge base: crag indexes text files only (...), PDF and DOCX", a contradiction that
    named no extra. It says what to install, as `crag index` does."""
    from crag.config import Settings
    from crag.errors import ToolError
    from crag.index import readers
    from crag.state import ToolCall
    from crag.tools import Toolbox

    assert cli("index", "docs")[0] == 0
    monkeypatch.setattr(readers.Reader, "available", lambda self: self.module is None)
    box = Toolbox(Settings(index_dir=str(kb.parent / ".crag")), roots=[kb], cwd=kb.parent)
    try:
        assert "docs/guide.pdf" in [item.source for item in box.run(ToolCall("vector_search", {"query": "torque wrench"}))]
        with pytest.raises(ToolError) as err:
            list(box.run(ToolCall("read_file", {"path": "docs/guide.pdf:p2:L2"})))
    finally:
        box.close()
    assert str(err.value) == "read_file: cannot read docs/guide.pdf (reading PDF needs the extra: pip install 'crag-kb[pdf]')"


def test_ask_and_search_with_kb_say_which_files_a_missing_extra_leaves_out(kb: Path, monkeypatch) -> None:
    """A folder of PDFs asked about where pypdf is not installed: the answer finds nothing, and
    stderr says why and how to include them, on every run (not only the one that indexed)."""
    from crag.index import readers

    monkeypatch.setattr(readers.Reader, "available", lambda self: self.module is None)
    pdfs = kb.parent / "pdfs"
    pdfs.mkdir()
    (kb / "guide.pdf").rename(pdfs / "guide.pdf")
    line = "crag: skipped by type: 1 .pdf (to include them: pip install 'crag-kb[pdf]')"
    for _ in range(2):
        code, out, err = cli("ask", "Which torque wrench does the widget need?", "--kb", "pdfs")
        assert code == 0 and "couldn't find" in out and line in err.splitlines(), err
        code, out, err = cli("search", "torque wrench", "--kb", "pdfs")
        assert code == 0 and line in err.splitlines(), err
    code, out, err = cli("ask", "Where is the harbour shop?", "--kb", "docs")  # a .png is no extra's to read
    assert code == 0 and "1 .docx (to include them: pip install 'crag-kb[docx]')" in err and ".png" not in err, err


def test_gitignore_and_cragignore_are_respected_like_ripgrep(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "project"
    for rel in ("docs/a.md", "docs/keep.log.md", "docs/drafts/b.md", "dist/out.md", "vendor/lib/x.md",
                "docs/sub/c.md", "docs/sub/d.md", "release-notes.md", "node_modules/pkg/readme.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# T\n\ntext\n", encoding="utf-8")
    (root / ".git").mkdir()
    (root / ".gitignore").write_text("dist/\n*.log.md\n!keep.log.md\nvendor/\n")
    (root / "docs" / ".cragignore").write_text("drafts/\n")
    (root / "docs" / "sub" / ".gitignore").write_text("d.md\n")
    (root / "docs" / "sub" / ".cragignore").write_text("!d.md\nc.md\n")  # .cragignore wins in its folder
    found = {str(Path(f.path).relative_to(root)) for f in discover([str(root)]).files}
    assert found == {"docs/a.md", "docs/keep.log.md", "docs/sub/d.md", "release-notes.md"}
    # A root below the ignore file still honours it (up to the git work tree's top).
    below = {str(Path(f.path).relative_to(root)) for f in discover([str(root / "docs")]).files}
    assert below == {"docs/a.md", "docs/keep.log.md", "docs/sub/d.md"}

    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(root)
    code, out, _ = cli("index", ".", "--exclude", "release-notes.md", "--exclude", "docs/sub/")
    assert code == 0 and "2 added" in out and "release-notes.md" not in out
    code, out, _ = cli("search", "text", "--json")
    assert {h["path"] for h in json.loads(out)} == {"docs/a.md", "docs/keep.log.md"}
    code, out, _ = cli("ask", "what is in dist/out.md?", "--json")
    assert code == 0 and "dist/out.md" not in {c["path"] for c in json.loads(out)["citations"]}


def test_a_pdf_may_be_larger_than_a_text_file(kb: Path) -> None:
    """A PDF's size is mostly images and fonts: it is read up to DOCUMENT_MAX_BYTES, a text
    file up to the limit of text."""
    from crag.index.discover import DOCUMENT_MAX_BYTES, size_limit

    limit = (kb / "notes.md").stat().st_size - 1  # notes.md is over it, guide.pdf far more so
    found = discover([str(kb)], max_bytes=limit)
    names = {Path(f.path).name for f in found.files}
    assert "guide.pdf" in names and "report.docx" in names and "notes.md" not in names
    assert any(path.endswith("notes.md") and "larger than" in why for path, why in found.warnings)
    assert size_limit("a.pdf", 100) == DOCUMENT_MAX_BYTES and size_limit("a.md", 100) == 100
    # A saved page holds its images inline (data: URIs): its text, checked as it is read, decides.
    assert size_limit("page.html", 100) == DOCUMENT_MAX_BYTES


def test_a_grep_match_in_a_pdf_keeps_its_window_on_the_matching_page(kb: Path, tmp_path: Path) -> None:
    """A place in a PDF is a page and lines on that page, and a range never spans two pages
    (docs/cli.md). A grep match on page 2's first line had a window reaching back into page 1's
    blank padding (``p1:L999-p2:L3``, lines no reader of the PDF can find), and one on page 1
    ran on into that padding (``p1:L1-L4`` of a two-line page)."""
    from crag.config import Settings
    from crag.pages import location
    from crag.state import ToolCall
    from crag.tools import Toolbox

    assert cli("index", "docs")[0] == 0
    box = Toolbox(Settings(index_dir=str(tmp_path / ".crag")), cwd=tmp_path)
    try:
        [first] = [i for i in box.run(ToolCall("grep_search", {"pattern": "installation steps"})) if i.source == "docs/guide.pdf"]
        [intro] = [i for i in box.run(ToolCall("grep_search", {"pattern": "introduction"})) if i.source == "docs/guide.pdf"]
    finally:
        box.close()
    assert location(first.source, first.start_line, first.end_line) == {"page": 2, "start_line": 1, "end_line": 3}
    assert first.text == "Installation steps follow.\nThe widget needs a torque wrench.\nTighten every flange to forty newton metres."
    assert location(intro.source, intro.start_line, intro.end_line) == {"page": 1, "start_line": 1, "end_line": 2}
    assert intro.text == "Widget guide\nAn introduction to the widget."


def test_a_pdf_ending_in_blank_pages_keeps_its_page_count(kb: Path, tmp_path: Path) -> None:
    """The text of a PDF ended at its last line of text, so its blank last pages were gone:
    ``read_file`` of page 4 of a four-page PDF whose last page is blank said "has 3 pages;
    page 4 is past the end"; it is a page with no text, as a blank page inside it is."""
    from crag.config import Settings
    from crag.errors import ToolError
    from crag.state import ToolCall
    from crag.tools import Toolbox

    make_pdf(kb / "blank.pdf", [["First page."], [], ["Third page."], []])
    assert cli("index", "docs")[0] == 0
    box = Toolbox(Settings(index_dir=str(tmp_path / ".crag")), cwd=tmp_path)
    try:
        for page, said in ((2, "page 2 of docs/blank.pdf has no text"), (4, "page 4 of docs/blank.pdf has no text"),
                           (5, "docs/blank.pdf has 4 pages; page 5 is past the end")):
            with pytest.raises(ToolError, match=said):
                box.run(ToolCall("read_file", {"path": "docs/blank.pdf", "page": page}))
        [third] = box.run(ToolCall("read_file", {"path": "docs/blank.pdf", "page": 3}))
    finally:
        box.close()
    assert third.text == "Third page."
