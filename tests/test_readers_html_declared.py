"""HTML as pages are saved: the character set a page declares (``<meta charset>``, the
``http-equiv`` form, an XHTML file's XML declaration) decides how its bytes read, and an XHTML
page's self-closed ``<script/>`` or ``<style/>`` is an empty element, not the rest of the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crag.index.readers import reader_for
from tests.fakes import clean_env
from tests.test_readers import cli

HTML_READER = reader_for("x.html")


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    return docs


PAGES = {
    # file name: (head declaring the charset, the body's sentence, the codec the bytes are in)
    "russian.html": ('<meta charset="windows-1251">', "Насос работает ночью.", "cp1251"),
    "japanese.html": ('<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">',
                      "ポンプの圧力は五バールです。", "shift_jis"),
    "polish.htm": ("<META CHARSET=iso-8859-2>", "Pompa w Łodzi ma ciśnienie.", "iso-8859-2"),
    "greek.xhtml": (None, "Η αντλία λειτουργεί.", "iso-8859-7"),
    # Seven-bit bytes with escape sequences: valid UTF-8 too, but only the declaration reads them.
    "mail.html": ('<meta charset="ISO-2022-JP">', "バルブは青いです。", "iso2022_jp"),
}


def _page(head: str | None, sentence: str) -> str:
    if head is None:  # an XHTML file declares its encoding in the XML declaration
        return ('<?xml version="1.0" encoding="ISO-8859-7"?>\n<html xmlns="http://www.w3.org/1999/xhtml">\n'
                f"<head><title>t</title></head>\n<body>\n<p>{sentence}</p>\n</body></html>\n")
    return f"<html><head>{head}<title>t</title></head>\n<body>\n<p>{sentence}</p>\n</body></html>\n"


def test_a_page_reads_in_the_character_set_it_declares(folder: Path) -> None:
    for name, (head, sentence, codec) in PAGES.items():
        (folder / name).write_bytes(_page(head, sentence).encode(codec))
        assert HTML_READER.read((folder / name).read_bytes()).split("\n")[4 if head is None else 2] == sentence
    code, out, _ = cli("index", "docs")
    assert code == 0 and f"{len(PAGES)} added" in out
    for name, (_, sentence, _) in PAGES.items():
        code, out, _ = cli("search", sentence, "--json", "--top-k", "1")
        hits = json.loads(out)
        assert hits and hits[0]["path"] == f"docs/{name}" and sentence in hits[0]["text"], (name, hits)


def test_a_declaration_the_bytes_contradict_does_not_garble_the_page() -> None:
    # Declared Latin-1, written in UTF-8 (a template copied from an old site): the bytes win.
    data = '<meta charset="iso-8859-1"><p>Crème brûlée at the café.</p>\n'.encode()
    assert HTML_READER.read(data) == "Crème brûlée at the café.\n"
    # An unknown or impossible name is no declaration at all.
    assert HTML_READER.read(b'<meta charset="no-such-codec"><p>Plain words.</p>\n') == "Plain words.\n"
    assert HTML_READER.read('<meta charset="utf-16"><p>Grüße.</p>\n'.encode()) == "Grüße.\n"
    assert HTML_READER.read(b'<meta charset="cp037"><p>Plain words.</p>\n') == "Plain words.\n"  # EBCDIC
    # A codec that is no character set, and fails on the declaration's own bytes: the page was
    # skipped ("HTML cannot read it (UnicodeError: decoding with 'punycode' codec failed ...").
    assert HTML_READER.read(b'<meta charset="punycode"><p>Plain words.</p>\n') == "Plain words.\n"


def test_a_self_closed_script_or_style_of_an_xhtml_page_hides_nothing_after_it(folder: Path) -> None:
    (folder / "page.xhtml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml">\n'
        '<head><title>Turbine</title>\n<script type="text/javascript" src="app.js"/>\n<style type="text/css" />\n'
        "</head>\n<body>\n<p>The turbine blades are inspected weekly.</p>\n<script>var hidden = 1;</script>\n"
        "</body></html>\n", encoding="utf-8")
    text = HTML_READER.read((folder / "page.xhtml").read_bytes())
    assert text.split("\n")[7] == "The turbine blades are inspected weekly." and "hidden" not in text
    code, out, _ = cli("search", "turbine blades inspected", "--kb", "docs", "--json")
    hits = json.loads(out)
    assert code == 0 and hits[0]["path"] == "docs/page.xhtml" and hits[0]["end_line"] == 8
    assert "The turbine blades are inspected weekly." in hits[0]["text"]


def test_a_saved_page_larger_than_a_text_file_is_read_for_its_text(folder: Path) -> None:
    """A page saved with its images inline (data: URIs) is tens of MiB of markup around a little
    text: like a PDF, it is read up to the documents' size limit, and its text decides."""
    image = "QUJD" * (3 * 1024 * 1024)  # 12 MiB of base64, more than a text file may hold
    (folder / "saved.html").write_text(
        f'<html><body>\n<p>The crane hook is inspected monthly.</p>\n<img src="data:image/png;base64,{image}">\n'
        "<p>Load tests follow each repair.</p>\n</body></html>\n", encoding="ascii")
    code, out, _ = cli("index", "docs")
    assert code == 0 and "1 added" in out and "skipped" not in out, out
    code, out, _ = cli("search", "load tests repair", "--json")
    hit = json.loads(out)[0]
    assert hit["path"] == "docs/saved.html" and "Load tests follow each repair." in hit["text"] and hit["end_line"] == 4


def test_reading_html_stops_once_its_text_is_over_the_limit() -> None:
    """The scan checks its budget as it goes, so markup dense with text is refused when its text
    passes the limit, not after reading all of a large page."""
    from crag.index.html_text import html_text

    calls: list[int] = []

    def check(size: int) -> None:
        calls.append(size)
        if size > 1000:
            raise ValueError("over")

    with pytest.raises(ValueError, match="over"):
        html_text("<p>words and more words</p>\n" * 100_000, check)
    assert len(calls) < 100 and calls[-1] > 1000


def test_a_declaration_inside_a_comment_declares_nothing() -> None:
    """As a browser's prescan reads a page: a commented-out ``<meta charset>`` before the real
    one chose Shift_JIS for a cp1252 page ("Cr鑪e br璉馥"), saved or fetched by web_fetch."""
    from crag.index.html_text import declared_codec

    head = '<!-- <meta charset="shift_jis"> --><meta charset="windows-1252">'
    data = f"{head}<p>Crème brûlée at the café.</p>\n".encode("cp1252")
    assert declared_codec(data) == "cp1252"
    assert HTML_READER.read(data) == "Crème brûlée at the café.\n"
    assert declared_codec(b'<!-- no end <meta charset="shift_jis">') is None
    for empty in (b"<!-->", b"<!--->"):  # whole comments: the declaration after them counts
        assert declared_codec(empty + b'<meta charset="windows-1251"><p>x</p>') == "cp1251"
    # a "<!--" inside a quoted value opens no comment: the tag is read whole, as the prescan reads it
    quoted = b'<head><link rel="icon" title="<!--"><meta charset="windows-1251"><p title="-->">x</p>'
    assert declared_codec(quoted) == "cp1251"
