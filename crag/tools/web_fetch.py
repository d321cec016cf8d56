"""``web_fetch(url)``: a public web page as evidence (on when ``KB_AGENT_WEB_FETCH=on``).

Only ``http``/``https`` URLs of public addresses are fetched: the host is resolved and
every address it resolves to must pass ``address_allowed`` (default
``crag.tools.http.is_public_address``), again on every redirect (at most
``MAX_REDIRECTS``); the body is cut at ``MAX_BYTES`` and the request has a deadline.
HTML is reduced to text; a JSON array yields one evidence item per element (each with the
URL plus ``#item-N`` as its source, so items stay distinct); other JSON and plain text
become one item; JSON nested deeper than Python parses is read as text. A body holding NUL
bytes is binary, whatever its ``Content-Type`` says, and refused like any binary type, unless
it is UTF-16 text (``is_binary``). The body is decoded as browsers decode it (``_text``): its
byte order mark decides, then the header's charset, then an HTML page's ``<meta charset>``.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urldefrag

from ..errors import ToolError
from ..index.decoding import decode_text, utf16_codec
from ..index.discover import is_binary
from ..index.html_text import declared_codec
from ..prompts.find import find_urls
from ..state import EvidenceItem
from ..toolspec import Param, QuestionArg, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from .http import Response

NAME = "web_fetch"
MAX_BYTES = 1024 * 1024
MAX_REDIRECTS = 3
MAX_TEXT = 40_000
MAX_ITEMS = 50
_TEXTUAL = ("text/", "application/json", "application/xml", "application/xhtml", "application/ld+json")


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    from .http import FetchError, html_to_text, http_get, is_public_address, system_resolver  # loaded on first run

    url = args["url"]
    if not url.lower().startswith(("http://", "https://")):
        raise ToolError(NAME, f"only http:// and https:// URLs can be fetched, not {url!r}")
    try:
        resp = http_get(
            url,
            headers={"Accept": "text/html, application/json;q=0.9, text/*;q=0.8"},
            timeout=context.http.timeout,
            max_bytes=MAX_BYTES,
            max_redirects=MAX_REDIRECTS,
            address_allowed=context.http.address_allowed or is_public_address,
            resolver=context.http.resolver or system_resolver,
            truncate=True,
        )
    except FetchError as exc:
        raise ToolError(NAME, str(exc)) from exc
    ctype = resp.content_type
    if ctype and not ctype.startswith(_TEXTUAL) and not ctype.endswith(("+json", "+xml")):
        raise ToolError(NAME, f"{resp.url} is {ctype}, not text")
    if is_binary(resp.body):  # a binary body, whatever its Content-Type claims
        raise ToolError(NAME, f"{resp.url} is binary, not text")
    final = urldefrag(resp.url)[0]
    body = _text(resp)
    if "json" in ctype or (not ctype and body.lstrip()[:1] in "[{"):
        items = _json_items(body, final)
        if items is not None:
            return ToolResult(items)
    title = ""
    if "html" in ctype or (not ctype and "<html" in body[:2000].lower()):
        title, body = html_to_text(body)
    text = _cap(body.strip())
    if not text:  # a page whose first MiB is only a script or whitespace: no item holding only the cut's marker
        raise ToolError(NAME, f"{final} has no text" + (f" in its first {MAX_BYTES // 1024} KiB" if resp.truncated else ""))
    if resp.truncated:
        text += f"\n[... cut at {MAX_BYTES // 1024} KiB]"
    return ToolResult((EvidenceItem(tool=NAME, source=final, text=text, url=final, title=title),))


def _text(resp: Response) -> str:
    """The body as browsers read it: in the codec of its byte order mark, else of its
    ``Content-Type``'s charset, else (HTML) of the charset the page declares in its first bytes,
    else UTF-16 when it is UTF-16 text without a mark (NUL bytes ``is_binary`` let through), else
    UTF-8, and a body that is not UTF-8 line by line as cp1252 (``decode_text``, as a saved page). A UTF-16 body sent as another character set is a tool error: read so, it is NULs."""
    codec = resp.encoding
    if codec is None and ("html" in resp.content_type or (not resp.content_type and b"<html" in resp.body[:2000].lower())):
        codec = _declared(resp.body)
    if b"\x00" in resp.body[:8192]:
        codec = codec or utf16_codec(resp.body)
        if codec is None or not codecs.lookup(codec).name.startswith("utf-16"):
            raise ToolError(NAME, f"{resp.url} is UTF-16 text but says it is {codec}: it cannot be read as that")
    if codec is None:  # said nowhere: UTF-8, else line by line cp1252, as crag reads a saved page
        return decode_text(resp.body)
    return resp.text(codec)


def _declared(body: bytes) -> str | None:
    """The codec of the charset an HTML page declares (``<meta charset>``, as crag reads a saved
    page: ``declared_codec``), or None; UTF-8 when the page is UTF-8 beyond ASCII whatever it
    declares (a template that still says Latin-1)."""
    codec = declared_codec(body)
    if codec not in (None, "utf-8") and not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return codec
        return "utf-8"
    return codec


def _json_items(body: str, final: str) -> tuple[EvidenceItem, ...] | None:
    """The evidence of a JSON body (one item per element of an array), or None when the body is
    not JSON Python can read (nested deeper than it parses, too): it is then read as text."""
    try:
        data = json.loads(body)
        if isinstance(data, list):
            return tuple(
                EvidenceItem(
                    tool=NAME,
                    source=f"{final}#item-{i + 1}",
                    text=_cap(element if isinstance(element, str) else json.dumps(element, indent=1, ensure_ascii=False)),
                    url=final,
                    title=f"item {i + 1} of {len(data)}",
                )
                for i, element in enumerate(data[:MAX_ITEMS])
            )
        return (EvidenceItem(tool=NAME, source=final, text=_cap(json.dumps(data, indent=1, ensure_ascii=False)), url=final),)
    except (ValueError, RecursionError):
        return None


def _cap(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "\n[... truncated]"


def _designated(raw: Any, found: Any) -> str | None:
    if not isinstance(raw, str):
        return None
    url = raw.strip()
    for candidate in found:
        if url == candidate or url.rstrip("/") == candidate.rstrip("/"):
            return candidate
    return None


def _fetchable(url: str) -> bool:
    """Whether ``url`` is one ``is_public_address`` may let through: not localhost, nor an
    address written in it that is not public (a name's addresses only resolving tells)."""
    import ipaddress
    from urllib.parse import urlsplit

    from .http import is_public_address  # loaded when asked, as run loads it

    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
        return host != "localhost" and not host.endswith(".localhost") and is_public_address(ipaddress.ip_address(host))
    except ValueError:  # a name
        return True


TOOL = Tool(
    name=NAME,
    description="fetch a public web page",
    run=run,
    params=(Param("url", required=True, max_length=4096, hint='"https://..."'),),
    question_arg=QuestionArg("url", find_urls, "an http(s) URL", _designated, _fetchable),
    enabled=lambda settings: bool(settings.web_fetch),
    enable_hint="set KB_AGENT_WEB_FETCH=on",
)
