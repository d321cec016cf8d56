"""A document whose content is not what its name says: a PDF saved as ``.html`` (a download
page's name), an error page saved as ``.pdf``. Each is one skipped file whose reason says what
the file is, never the reader's parse error, nor another format's syntax indexed as text."""

from __future__ import annotations

from pathlib import Path

import pytest

from crag.index.readers import read_document, reader_for
from tests.test_readers import make_docx, make_pdf

pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
pytest.importorskip("docx", reason="the docx extra (make install has it)")


def refusal(name: str, data: bytes) -> str:
    with pytest.raises(ValueError) as caught:
        read_document(reader_for(name), data)
    return str(caught.value)


def test_a_pdf_named_html_is_refused_saying_what_it_is(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "guide.pdf", [["Page about dockside winches."]]).read_bytes()
    assert b"\x00" not in pdf[:8192]  # not binary by its first bytes: it was read as HTML
    assert refusal("guide.html", pdf) == "it is not HTML but a PDF: rename it to .pdf to index it"
    docx = make_docx(tmp_path / "r.docx").read_bytes()
    assert refusal("r.htm", docx) == "it is not HTML but a DOCX: rename it to .docx to index it"


def test_a_page_or_a_text_named_pdf_is_refused_saying_what_it_is(tmp_path: Path) -> None:
    assert refusal("report.pdf", b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n") == (
        "it is not a PDF but an HTML page")
    assert refusal("report.pdf", b"\n\n<html><body>Access denied</body></html>\n") == "it is not a PDF but an HTML page"
    assert refusal("empty.pdf", b"") == "the file is empty"
    assert refusal("r.pdf", make_docx(tmp_path / "r.docx").read_bytes()) == (
        "it is not a PDF but a DOCX: rename it to .docx to index it")
    # A download's error saved as .pdf in another form than a page said "Stream has ended unexpectedly".
    for error in (b"Access denied\n", b'{"error": "not found"}',
                  b'<?xml version="1.0"?>\n<Error><Code>AccessDenied</Code></Error>\n'):
        assert refusal("report.pdf", error) == "it is not a PDF (it does not start with %PDF-, as a PDF does)"
    # A PDF cut short keeps pypdf's reason: it is a PDF, damaged; what was "Stream has ended
    # unexpectedly" alone says the file is cut short (a copy or a download interrupted).
    pdf = make_pdf(tmp_path / "g.pdf", [["Page one."]]).read_bytes()
    why = refusal("g.pdf", pdf[:200])
    assert why.startswith("pypdf cannot read it (")
    assert why.endswith("): the PDF is cut short, with no %%EOF at its end (copy it again)"), why


def test_a_git_lfs_pointer_in_a_documents_place_says_how_to_fetch_the_document() -> None:
    """A clone made without Git LFS's files holds a pointer of three lines in place of each PDF:
    the reason was pypdf's "Stream has ended unexpectedly", as if every PDF were damaged."""
    pointer = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n")
    for name in ("guide.pdf", "report.docx", "page.html"):
        assert refusal(name, pointer) == "it is a Git LFS pointer, not the file itself: run git lfs pull to fetch it"


def test_a_git_lfs_pointer_in_a_text_files_place_is_not_indexed_as_its_text() -> None:
    """Git LFS keeps large CSV and JSON files too: their pointer was indexed and cited as their
    text ("version https://git-lfs..."), with nothing said; it is refused as a document's is."""
    from crag.index.discover import text_of

    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 12345\n"
    for name in ("data.csv", "notes.md", "schema.json"):
        with pytest.raises(ValueError, match=r"^it is a Git LFS pointer, not the file itself: run git lfs pull"):
            text_of(name, pointer)
    assert text_of("notes.md", b"# LFS\n\n" + pointer) == "# LFS\n\n" + pointer.decode()  # one quoted is text


def test_a_pdf_or_a_page_named_docx_is_refused_saying_what_it_is(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "guide.pdf", [["Page one."]]).read_bytes()
    assert refusal("guide.docx", pdf) == "it is not a DOCX but a PDF: rename it to .pdf to index it"
    assert refusal("page.docx", b"<html><body>Moved</body></html>") == "it is not a DOCX but an HTML page"


def test_a_docx_cut_short_is_damaged_not_another_format(tmp_path: Path) -> None:
    """A partial copy starts as a zip archive and has no zip directory: it is a DOCX, damaged,
    as a PDF cut short is; bytes that never were a zip archive are still not a DOCX."""
    docx = make_docx(tmp_path / "r.docx").read_bytes()
    for cut in (len(docx) * 95 // 100, len(docx) // 2, 30):
        assert refusal("r.docx", docx[:cut]).startswith(
            "the DOCX is damaged or cut short (its zip archive cannot be opened: ")
    assert refusal("r.docx", b"plain words, no archive").startswith("it is not a DOCX (not a zip archive: ")
