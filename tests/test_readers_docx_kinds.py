"""Files named ``.docx`` that are something else, and Word documents that are not plain DOCX:
a workbook, a presentation or an e-book renamed is one line saying what it is; a macro-enabled
document or a template (Word's own formats, ``.docm`` and ``.dotx``) is read as a DOCX is."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest

from crag.index.readers import read_document, reader_for
from tests.test_readers import make_docx

pytest.importorskip("docx", reason="the docx extra (make install has it)")

_TYPES = ('<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
          '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
          '<Default Extension="xml" ContentType="application/xml"/><Override PartName="/{part}" ContentType="{type}"/></Types>')
_RELS = ('<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
         '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
         'Target="{part}"/></Relationships>')


def office_package(part: str, content_type: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("[Content_Types].xml", _TYPES.format(part=part, type=content_type))
        z.writestr("_rels/.rels", _RELS.format(part=part))
        z.writestr(part, '<?xml version="1.0"?><root/>')
    return out.getvalue()


def zip_of(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return out.getvalue()


def refusal(data: bytes) -> str:
    with pytest.raises(ValueError) as caught:
        read_document(reader_for("x.docx"), data)
    return str(caught.value)


def test_a_zip_of_something_else_named_docx_is_one_line_saying_what_it_is() -> None:
    sheet = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"
    slides = "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"
    assert refusal(office_package("xl/workbook.xml", sheet)) == "it is not a DOCX but an Excel workbook"
    assert refusal(office_package("ppt/presentation.xml", slides)) == "it is not a DOCX but a PowerPoint presentation"
    assert refusal(zip_of({"mimetype": "application/epub+zip", "OEBPS/a.xhtml": "<p>x</p>"})) == (
        "it is not a DOCX but a zip archive of application/epub+zip")
    assert refusal(zip_of({"notes.txt": "hello"})) == "it is not a DOCX but a zip archive with no Word document in it"
    for why in map(refusal, (office_package("xl/workbook.xml", sheet), zip_of({"a": "b"}))):
        assert not re.search(r"0x[0-9a-f]+|object at|KeyError", why), why


def test_a_macro_enabled_document_or_a_template_is_read_as_a_docx(tmp_path: Path) -> None:
    plain = make_docx(tmp_path / "report.docx").read_bytes()
    expected = read_document(reader_for("report.docx"), plain)
    assert "The gearbox ships in March." in expected
    main = "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"
    for name, content_type in (("macros.docm", "application/vnd.ms-word.document.macroEnabled.main+xml"),
                               ("letter.dotx", "application/vnd.openxmlformats-officedocument.wordprocessingml.template.main+xml"),
                               ("renamed.docx", "application/vnd.ms-word.document.macroEnabled.main+xml")):
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(plain)) as src, zipfile.ZipFile(out, "w") as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename == "[Content_Types].xml":
                    assert main.encode() in data
                    data = data.replace(main.encode(), content_type.encode())
                dst.writestr(info, data)
        reader = reader_for(name)
        assert reader is not None and reader.name == "DOCX", name
        assert read_document(reader, out.getvalue()) == expected, name


def test_an_old_word_file_an_encrypted_docx_and_an_empty_file_each_say_so() -> None:
    """An OLE compound file named .docx is a Word 97-2003 document, or (holding an
    EncryptedPackage stream) a DOCX that Word encrypted with a password."""
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 504
    assert refusal(ole + b"W\x00o\x00r\x00d\x00D\x00o\x00c\x00" + b"\x00" * 1000) == (
        "it is not a DOCX but a Word 97-2003 document (.doc): save it as .docx to index it")
    assert refusal(ole + "EncryptedPackage".encode("utf-16-le") + b"\x00" * 1000) == "the DOCX is encrypted with a password"
    assert refusal(b"") == "the file is empty"


def test_a_word_document_saved_as_strict_open_xml_says_how_to_index_it(tmp_path: Path) -> None:
    """Word's "Strict Open XML Document" is a .docx whose relationships python-docx does not
    know: it was refused as "not a DOCX but a zip archive with no Word document in it"."""
    with zipfile.ZipFile(make_docx(tmp_path / "r.docx")) as z:
        parts = {name: z.read(name) for name in z.namelist()}
    strict = zip_of({name: data.replace(b"http://schemas.openxmlformats.org/officeDocument/2006/relationships",
                                        b"http://purl.oclc.org/ooxml/officeDocument/relationships").decode()
                     for name, data in parts.items() if name.endswith((".xml", ".rels"))})
    assert refusal(strict) == ("it is a Word document saved as Strict Open XML, which python-docx cannot read: "
                               "save it as a Word Document (.docx) to index it")


def test_a_docx_missing_a_part_it_names_is_damaged_not_another_kind_of_zip(tmp_path: Path) -> None:
    """A Word document whose archive lacks a part its relationships name (its styles, a header,
    its body) was refused as "not a DOCX but a zip archive with no Word document in it": a
    Word document, called something else, with nothing saying what is wrong with it."""
    plain = make_docx(tmp_path / "r.docx").read_bytes()
    for missing in ("word/styles.xml", "word/document.xml", "[Content_Types].xml", "_rels/.rels"):
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(plain)) as src, zipfile.ZipFile(out, "w") as dst:
            for info in src.infolist():
                if info.filename != missing:
                    dst.writestr(info, src.read(info))
        assert refusal(out.getvalue()) == f"the DOCX is damaged (its part {missing} is missing)", missing
