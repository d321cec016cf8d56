"""How ``web_fetch`` decodes a body, as browsers do: a byte order mark first, then the charset
of ``Content-Type``, then (HTML) the charset the page declares, then UTF-8 (a body that is not UTF-8: line by line
cp1252, as a saved page is read). A body that
cannot be read so is one ``ToolError``, never text of NULs and replacement characters."""

from __future__ import annotations

from pathlib import Path

import pytest

from crag.errors import ToolError
from tests.test_tools_remote import fetch, loopback_only, server, web_box

__all__ = ["server"]  # the fixture, shared with test_tools_remote

SENTENCE = "The server listens on port 9090."
PAGE = f"<html><head><title>Ports</title></head><body><p>{SENTENCE}</p></body></html>"


def read(server, tmp_path: Path, body: bytes, content_type: str | None):
    headers = {} if content_type is None else {"Content-Type": content_type}
    site = server({"/p": lambda h: (200, headers, body)})
    return fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/p")


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-8-sig"])
@pytest.mark.parametrize("content_type", ["text/plain", None, "text/plain; charset=iso-8859-1"])
def test_a_byte_order_mark_decides_how_a_body_reads(server, tmp_path: Path, codec: str, content_type) -> None:
    """A UTF-16 body with its mark and no charset was decoded as UTF-8: the evidence was
    '\\ufffd\\ufffdT\\x00h\\x00e\\x00 ...'. The mark outranks a charset the header names too."""
    body = SENTENCE.encode(codec)
    if codec == "utf-16-be":
        body = b"\xfe\xff" + body
    [item] = read(server, tmp_path, body, content_type)
    assert item.text == SENTENCE


@pytest.mark.parametrize("content_type", ["text/html", None])
def test_a_utf16_page_with_its_mark_is_read_as_html(server, tmp_path: Path, content_type) -> None:
    [item] = read(server, tmp_path, PAGE.encode("utf-16"), content_type)
    assert item.title == "Ports" and item.text == SENTENCE


def test_a_utf16_body_without_a_mark_or_a_charset_reads_as_utf16(server, tmp_path: Path) -> None:
    [item] = read(server, tmp_path, SENTENCE.encode("utf-16-le"), "text/plain")
    assert item.text == SENTENCE


@pytest.mark.parametrize(
    ("head", "sentence", "codec"),
    [
        ('<meta charset="shift_jis">', "東京オフィスのポートは9090です。", "shift_jis"),
        ('<meta http-equiv="Content-Type" content="text/html; charset=windows-1251">', "Насос работает ночью.", "cp1251"),
        ("<meta charset='iso-8859-1'>", "Crème brûlée at the café.", "latin-1"),
    ],
)
@pytest.mark.parametrize("content_type", ["text/html", None])
def test_a_page_is_read_in_the_charset_it_declares(server, tmp_path: Path, head, sentence, codec, content_type) -> None:
    """A Shift_JIS page declaring ``<meta charset="shift_jis">`` (no charset in the header)
    was decoded as UTF-8: '\\ufffd\\ufffd\\ufffd\\ufffdI\\ufffdt\\ufffdB\\ufffdX...'."""
    body = f"<html><head>{head}<title>T</title></head><body><p>{sentence}</p></body></html>".encode(codec)
    [item] = read(server, tmp_path, body, content_type)
    assert item.text == sentence


def test_the_header_charset_outranks_the_page_and_a_utf8_page_outranks_a_stale_declaration(server, tmp_path: Path) -> None:
    page = "<html><head><meta charset='shift_jis'></head><body><p>Crème brûlée.</p></body></html>"
    [item] = read(server, tmp_path, page.encode("latin-1"), "text/html; charset=iso-8859-1")
    assert item.text == "Crème brûlée."
    [item] = read(server, tmp_path, page.encode(), "text/html")
    assert item.text == "Crème brûlée."


@pytest.mark.parametrize("charset", ["utf-8", "iso-8859-1", "shift_jis"])
def test_a_utf16_body_sent_as_another_charset_is_a_tool_error(server, tmp_path: Path, charset: str) -> None:
    with pytest.raises(ToolError, match=rf"^web_fetch: http://127\.0\.0\.1:\d+/p is UTF-16 text but says it is {charset}"):
        read(server, tmp_path, SENTENCE.encode("utf-16-le"), f"text/plain; charset={charset}")


@pytest.mark.parametrize("body", [b"\xff\xfe" + b"\x00" * 64, b"\xff\xfeT\x00\x01\x02\x00\x00\xff\xd8" * 20])
def test_binary_data_behind_a_utf16_mark_is_still_binary(server, tmp_path: Path, body: bytes) -> None:
    with pytest.raises(ToolError, match=r"is binary, not text$"):
        read(server, tmp_path, body, "text/plain")


@pytest.mark.parametrize("charset", ["punycode", "idna"])
def test_a_page_declaring_a_codec_that_is_no_charset_reads_as_utf8(server, tmp_path: Path, charset: str) -> None:
    [item] = read(server, tmp_path, f'<meta charset="{charset}"><p>Crème brûlée.</p>'.encode(), "text/html")
    assert item.text == "Crème brûlée."


@pytest.mark.parametrize("content_type", ["text/plain", "text/html", None])
def test_a_body_that_names_no_charset_and_is_not_utf8_reads_as_a_saved_file_does(server, tmp_path: Path, content_type) -> None:
    """A Latin-1 page naming no charset anywhere was decoded as UTF-8: 'Cr\\ufffdme br\\ufffdl\\ufffde',
    a word no question finds, where the same page saved in the knowledge base reads as cp1252."""
    sentence = "Crème brûlée at the café – open at 9."
    body = sentence.encode("cp1252") if content_type == "text/plain" else f"<html><body><p>{sentence}</p></body></html>".encode("cp1252")
    [item] = read(server, tmp_path, body, content_type)
    assert item.text == sentence
