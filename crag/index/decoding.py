"""Bytes to text, as crag reads every text file and every HTML page.

``decode_text`` is the one rule (UTF-16 with its byte order mark, else UTF-8, else each line as
UTF-8, cp1252 or latin-1) for every store and for ``read_file`` and ``grep_search``, so lines
and chunks agree; ``utf16_codec`` and ``utf16_text`` tell UTF-16 text from binary data.
"""

from __future__ import annotations

import re

__all__ = ["INVISIBLE", "UTF16_BOMS", "decode_text", "utf16_codec", "utf16_text", "without_invisible"]


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def utf16_codec(head: bytes) -> str | None:
    """The codec of bytes that open as UTF-16 text, else None: ``utf-16`` when they open with
    its byte order mark (Windows PowerShell 5 writes redirected output so); without one (some
    Windows tools), ``utf-16-le`` or ``utf-16-be`` when at least half the characters of the
    first 8 KiB have a NUL high byte (Latin text) and no low byte is NUL."""
    if head.startswith(UTF16_BOMS):
        return "utf-16"
    head = head[:8192]
    for codec, high, low in (("utf-16-le", head[1::2], head[0::2]), ("utf-16-be", head[0::2], head[1::2])):
        if high and high.count(0) * 2 >= len(high) and 0 not in low:
            return codec
    return None


def utf16_text(data: bytes) -> str | None:
    """The text of bytes that are UTF-16 (``utf16_codec``), else None: not UTF-16, an odd
    length, unpaired surrogates, or control characters that text does not hold (binary data
    that happens to look so)."""
    codec = utf16_codec(data)
    if codec is None or len(data) % 2:
        return None
    try:
        text = data.decode(codec)
    except UnicodeDecodeError:
        return None
    # With its byte order mark it says what it is: any control character but NUL is the text's
    # (Word's exports hold vertical tabs); without one, whitespace and ESC alone, lest binary
    # data that happens to decode pass for text.
    allowed = None if data.startswith(UTF16_BOMS) else "\t\n\r\f\v\x1b"
    if any(ch < " " and (ch == "\x00" if allowed is None else ch not in allowed) for ch in text):
        return None
    return text


def _decode_bytes(data: bytes) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\x00" in data:
        data = data.replace(b"\x00", b"")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        if _UTF8_SEQUENCE.search(data) is None:  # no UTF-8 line to keep: one decoding for all
            return _decode_line(data)
        # Line by line: a file that mixes UTF-8 and cp1252 lines (a log two tools append to)
        # keeps its UTF-8 lines as written, where decoding it whole as cp1252 garbled them.
        return "\n".join(_decode_line(line) for line in data.split(b"\n"))


# The start of a character of two or more bytes in UTF-8 (a lead byte and a continuation byte).
_UTF8_SEQUENCE = re.compile(rb"[\xc2-\xf4][\x80-\xbf]")


def _decode_line(line: bytes) -> str:
    """One line that is not all UTF-8 as a whole file is: UTF-8, else cp1252, else latin-1."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        try:
            return line.decode("cp1252")
        except UnicodeDecodeError:
            return line.decode("latin-1")


def decode_text(data: bytes) -> str:
    """Bytes to text: UTF-16 with its BOM (``utf16_text``), else UTF-8 (BOM dropped), else
    each line as UTF-8, else cp1252, else latin-1; newlines normalised, byte order marks, soft
    hyphens, zero-width spaces and word joiners dropped.

    NUL bytes are dropped: a file with one in its first 8 KiB is binary (``is_binary``) and
    never decoded; one further on is padding, and PostgreSQL refuses it in text. One rule,
    for every store and for ``read_file`` and ``grep_search``, so lines and chunks agree.
    """
    text = utf16_text(data)
    if text is None:
        text = _decode_bytes(data)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return without_invisible(text)


# A BOM inside a text, soft hyphen, zero-width space and word joiner: no glyph, and each splits
# the word it sits in. Every reader drops them (see ``without_invisible``; HTML too).
INVISIBLE = "\ufeff\u00ad\u200b\u2060"
_INVISIBLE = re.compile(f"[{INVISIBLE}]")


def without_invisible(text: str) -> str:
    """``text`` without a BOM inside it (files joined with cat), soft hyphens, zero-width spaces
    and word joiners (pasted from a web page): invisible, and they split the word they sit in
    for the full-text index, in a document as in a query. The joiners that shape text (ZWJ,
    ZWNJ) stay."""
    return text if text.isascii() else _INVISIBLE.sub("", text)
