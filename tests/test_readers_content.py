"""What a person reads in a PDF, DOCX or HTML document is the text crag finds: the parts of a
DOCX beyond its body's paragraphs, PDF ligatures, HTML code blocks and navigation."""

from __future__ import annotations

from pathlib import Path

import pytest

from crag.index.readers import read_document, reader_for

docx = pytest.importorskip("docx", reason="the docx extra (make install has it)")
pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def _xml(text: str) -> object:
    from docx.oxml import parse_xml

    return parse_xml(text)


def rich_docx(path: Path) -> Path:
    """A DOCX with text in the places Word puts it besides plain paragraphs."""
    d = docx.Document()
    d.sections[0].header.paragraphs[0].text = "Header says confidential"
    d.sections[0].footer.paragraphs[0].text = "Footer says revision seven"
    d.add_paragraph("Intro paragraph.")
    d.add_paragraph("Torque\u00a0wrench settings")
    box = d.add_paragraph("Anchor paragraph")
    box._p.append(_xml(
        f'<w:r {W} xmlns:wps="http://schemas.microsoft.com/office/word/2010/wordprocessingShape">'
        '<w:drawing><wps:wsp><wps:txbx><w:txbxContent><w:p><w:r><w:t>Text box on gaskets</w:t></w:r></w:p>'
        '</w:txbxContent></wps:txbx></wps:wsp></w:drawing></w:r>'))
    body = d.element.body
    body.insert(len(body) - 1, _xml(f'<w:sdt {W}><w:sdtContent><w:p><w:r><w:t>Content control on valves</w:t>'
                                    '</w:r></w:p></w:sdtContent></w:sdt>'))
    table = d.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "Outer cell"
    table.cell(0, 1).add_table(rows=1, cols=1).cell(0, 0).text = "Nested cell on pumps"
    p = d.add_paragraph("Tracked: ")
    p._p.append(_xml(f'<w:ins {W} w:id="1" w:author="a"><w:r><w:t>inserted words</w:t></w:r></w:ins>'))
    p._p.append(_xml(f'<w:del {W} w:id="2" w:author="a"><w:r><w:delText>deleted words</w:delText></w:r></w:del>'))
    p = d.add_paragraph("Field: ")
    p._p.append(_xml(f'<w:fldSimple {W} w:instr="REF x"><w:r><w:t>field result</w:t></w:r></w:fldSimple>'))
    p = d.add_paragraph("Inline: ")
    p._p.append(_xml(f'<w:sdt {W}><w:sdtContent><w:r><w:t>inline control</w:t></w:r></w:sdtContent></w:sdt>'))
    d.add_paragraph("Last body paragraph.")
    d.save(path)
    return path


def test_a_docx_is_read_with_its_headers_footers_text_boxes_controls_and_nested_tables(tmp_path: Path) -> None:
    text = read_document(reader_for("x.docx"), rich_docx(tmp_path / "r.docx").read_bytes())
    lines = text.splitlines()
    # The body keeps one line per paragraph or table row, in order; a text box follows its anchor.
    assert lines[:9] == [
        "Intro paragraph.", "Torque wrench settings", "Anchor paragraph", "Text box on gaskets",
        "Content control on valves", "Outer cell | Nested cell on pumps", "Tracked: inserted words",
        "Field: field result", "Inline: inline control",
    ], lines
    assert lines[9] == "Last body paragraph."
    # Then the headers and footers, after the body, so the body's line numbers stay as they were.
    assert lines[10:] == ["Header says confidential", "Footer says revision seven"], lines
    assert "deleted words" not in text


def test_a_docx_footnote_is_read_after_the_body(tmp_path: Path) -> None:
    import zipfile

    src = zipfile.ZipFile(rich_docx(tmp_path / "r.docx"))
    path = tmp_path / "notes.docx"
    with zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "[Content_Types].xml":
                data = data.replace(b"</Types>", b'<Override PartName="/word/footnotes.xml" ContentType="application/'
                                    b'vnd.openxmlformats-officedocument.wordprocessingml.footnotes+xml"/></Types>')
            elif info.filename == "word/_rels/document.xml.rels":
                data = data.replace(b"</Relationships>", b'<Relationship Id="rId99" Type="http://schemas.openxmlformats'
                                    b'.org/officeDocument/2006/relationships/footnotes" Target="footnotes.xml"/></Relationships>')
            out.writestr(info, data)
        out.writestr("word/footnotes.xml", f'<w:footnotes {W}><w:footnote w:type="separator" w:id="-1"><w:p><w:r>'
                     '<w:separator/></w:r></w:p></w:footnote><w:footnote w:id="1"><w:p><w:r><w:t>Footnote on the '
                     'torque table</w:t></w:r></w:p></w:footnote></w:footnotes>')
    lines = read_document(reader_for("x.docx"), path.read_bytes()).splitlines()
    assert lines[10:] == ["Header says confidential", "Footer says revision seven", "Footnote on the torque table"], lines


def test_a_line_break_inside_a_docx_runs_text_keeps_its_paragraph_on_one_line(tmp_path: Path) -> None:
    """Apache POI writes run.setText("a\\nb") as a line break inside <w:t>, which Word shows as a
    space: it split the paragraph over two lines, and every later citation pointed a line early."""
    from tests.test_readers_hostile import docx_with

    path = docx_with(tmp_path / "r.docx", b'<w:p><w:r><w:t xml:space="preserve">first half\nsecond half</w:t></w:r></w:p>'
                     b"<w:p><w:r><w:t>Last paragraph.</w:t></w:r></w:p>")
    lines = read_document(reader_for("x.docx"), path.read_bytes()).splitlines()
    assert lines[-2:] == ["first half second half", "Last paragraph."], lines


def test_pdf_ligatures_are_read_as_the_letters_a_person_types(tmp_path: Path) -> None:
    from tests.test_readers import make_pdf

    # \256 and \257 are the fi and fl glyphs of the standard encoding (pypdf gives U+FB01, U+FB02).
    pdf = make_pdf(tmp_path / "l.pdf", [["We \256nd the \257ange here."]])
    assert read_document(reader_for("l.pdf"), pdf.read_bytes()).splitlines()[0] == "We find the flange here."


def test_html_code_keeps_its_indentation_soft_hyphens_vanish_and_navigation_is_dropped() -> None:
    page = ("<nav><a href='/'>Home</a> Menu</nav>\n<p>soft&shy;ware</p>\n<pre><code>def f():\n"
            "    return  42\n</code></pre>\n<p>after   the  code</p>\n")
    lines = read_document(reader_for("x.html"), page.encode()).split("\n")
    assert lines[:6] == ["", "software", "def f():", "    return  42", "", "after the code"], lines


def test_an_html_entity_for_a_zero_width_space_or_word_joiner_splits_no_word() -> None:
    """``wam&#8203;bler`` shows as "wambler", but the zero-width space the entity wrote split the
    word for the full-text index, and no search for it found the page: dropped as a soft hyphen
    is, and as a text file drops them."""
    page = "<p>The wam&#8203;bler and tro&NoBreak;ggle and zib&ZeroWidthSpace;ble</p>\n<pre>x&#8203;y</pre>\n"
    lines = read_document(reader_for("x.html"), page.encode()).split("\n")
    assert lines[:2] == ["The wambler and troggle and zibble", "xy"], lines


def test_the_offline_answer_quotes_a_docx_paragraph_as_it_reads_never_run_into_the_one_above(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from tests.fakes import clean_env
    from tests.test_readers import cli

    d = docx.Document()
    d.add_heading("Maintenance", 1)
    d.add_paragraph("Check the torque wrench calibration every month", style="List Bullet")
    d.add_paragraph("Tighten the flange bolts to forty newton metres.")
    (tmp_path / "docs").mkdir()
    d.save(tmp_path / "docs" / "care.docx")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    assert cli("index", "docs")[0] == 0
    code, out, _ = cli("ask", "How tight are the flange bolts?", "--json")
    assert code == 0
    result = json.loads(out)
    assert "- Tighten the flange bolts to forty newton metres. [1]" in result["body"], result["body"]
    assert "calibration every month Tighten" not in result["body"]
    assert result["citations"][0]["line"] == 3


def test_a_word_broken_at_a_pdf_lines_end_is_read_whole_and_every_line_keeps_its_number(tmp_path: Path) -> None:
    from tests.test_readers import make_pdf

    pdf = make_pdf(tmp_path / "h.pdf", [["The infor-", "mation-based index, and more.", "Pre- and post-war",
                                         "years; 1990-", "2000 stay; a URL-", "Name too.", "last line"]])
    lines = read_document(reader_for("h.pdf"), pdf.read_bytes()).splitlines()
    assert lines[:7] == ["The information-based", "index, and more.", "Pre- and post-war", "years; 1990-",
                         "2000 stay; a URL-", "Name too.", "last line"], lines


def pdf_form(path: Path, values: dict[str, str]) -> Path:
    """A one-page PDF with a line of text and a filled text field per value (a widget with its
    value and an appearance stream, as a PDF viewer saves a filled form)."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import (
        ArrayObject,
        DecodedStreamObject,
        DictionaryObject,
        FloatObject,
        NameObject,
        TextStringObject,
    )

    from tests.test_readers import make_pdf

    writer = PdfWriter(clone_from=PdfReader(make_pdf(path, [["Service order form"]])))
    page, fields = writer.pages[0], ArrayObject()
    for n, (name, value) in enumerate(values.items()):
        look = DecodedStreamObject()
        look.set_data(f"/Tx BMC BT /F1 12 Tf 2 2 Td ({value}) Tj ET EMC".encode("latin-1"))
        look.update({NameObject("/Type"): NameObject("/XObject"), NameObject("/Subtype"): NameObject("/Form"),
                     NameObject("/BBox"): ArrayObject([FloatObject(0), FloatObject(0), FloatObject(300), FloatObject(20)])})
        top = 600 - 40 * n
        fields.append(writer._add_object(DictionaryObject({
            NameObject("/Type"): NameObject("/Annot"), NameObject("/Subtype"): NameObject("/Widget"),
            NameObject("/FT"): NameObject("/Tx"), NameObject("/T"): TextStringObject(name),
            NameObject("/V"): TextStringObject(value), NameObject("/P"): page.indirect_reference,
            NameObject("/Rect"): ArrayObject([FloatObject(72), FloatObject(top), FloatObject(372), FloatObject(top + 20)]),
            NameObject("/AP"): DictionaryObject({NameObject("/N"): writer._add_object(look)}),
        })))
    page[NameObject("/Annots")] = fields
    writer._root_object[NameObject("/AcroForm")] = DictionaryObject({NameObject("/Fields"): fields})
    writer.write(path)
    return path


def test_the_values_of_a_filled_pdf_form_are_read_on_their_page(tmp_path: Path) -> None:
    """A filled form's values live in its fields, not in the page's text: they are read after the
    page's lines, top to bottom, so a search finds them and a citation names their page."""
    path = pdf_form(tmp_path / "order.pdf", {"part": "Hydraulic filter HX42", "site": "Pier 7 workshop"})
    lines = read_document(reader_for("order.pdf"), path.read_bytes()).split("\n")
    assert lines[:3] == ["Service order form", "Hydraulic filter HX42", "Pier 7 workshop"]
    # A widget whose rectangle is damaged costs its value, never the page's text.
    data = path.read_bytes().replace(b"/Rect [ 72 600 372 620 ]", b"/Rect [ /A /B /C /D ]")
    assert data != path.read_bytes()
    assert read_document(reader_for("order.pdf"), data).split("\n")[:2] == ["Service order form", "Pier 7 workshop"]


def test_a_soft_hyphen_or_zero_width_space_in_a_docx_or_pdf_splits_no_word(tmp_path: Path) -> None:
    """A soft hyphen or a zero-width space written into a DOCX run's text (pasted from a web page)
    or mapped by a PDF font stayed in the text: the word was two words for the full-text index,
    and no search for it found the document, while a text file or an HTML page drops them."""
    from tests.test_readers_hostile import docx_with, pdf_with_unicode_map

    path = docx_with(tmp_path / "r.docx", "<w:p><w:r><w:t>The wam\u00adbler and zib\u200bble\u2060s</w:t></w:r></w:p>".encode())
    assert read_document(reader_for("x.docx"), path.read_bytes()).splitlines()[-1] == "The wambler and zibbles"
    pdf = pdf_with_unicode_map(tmp_path / "z.pdf", "The troAggle valve.", {"A": "200B"})
    assert read_document(reader_for("z.pdf"), pdf.read_bytes()).splitlines()[0] == "The troggle valve."
