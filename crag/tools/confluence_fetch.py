"""``confluence_fetch(page_id)``: one Confluence page as evidence (on when ``CONFLUENCE_BASE_URL`` is set).

GET ``{CONFLUENCE_BASE_URL}/rest/api/content/{id}?expand=body.storage,version`` with the
same auth rules as Jira (email + token: basic; token alone: bearer). ``page_id`` is the
numeric id, or a page URL containing ``/pages/<id>`` or ``pageId=<id>``. The page's
storage-format HTML is reduced to text (``storage_format``: code macros as fenced code); the item's source and URL are the page's web URL. A
title or body that is not text is left out (never shown as a Python value); a page with
neither is a ``ToolError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ToolError
from ..prompts.find import find_confluence_page_ids
from ..state import EvidenceItem
from ..toolspec import Param, QuestionArg, Tool, ToolContext, ToolResult
from .atlassian import get_json

NAME = "confluence_fetch"
MAX_BYTES = 8 * 1024 * 1024
MAX_TEXT = 60_000
_ID_IN_URL = re.compile(r"(?:/pages/|[?&]pageId=)(\d{1,20})")


def page_id_of(value: Any) -> str:
    """The numeric page id in ``value`` (an id or a page URL), or a ToolError."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit() and len(text) <= 20:
            return text
        m = _ID_IN_URL.search(text)
        if m:
            return m.group(1)
    raise ToolError(NAME, f"{value!r} is not a Confluence page id or page URL")


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    page_id = page_id_of(args.get("page_id"))
    settings = context.settings
    base = settings.confluence_base_url
    if not base:
        raise ToolError(NAME, "Confluence is not configured: set CONFLUENCE_BASE_URL")
    url = f"{base}/rest/api/content/{page_id}?expand=body.storage,version"
    data = get_json(NAME, "Confluence", "CONFLUENCE", url, settings.confluence_email,
                    settings.confluence_api_token, context.http.timeout, f"Confluence page {page_id}", MAX_BYTES)
    try:
        title = data.get("title") or ""
        html = ((data.get("body") or {}).get("storage") or {}).get("value") or ""
        links = data.get("_links") or {}
    except (AttributeError, TypeError) as exc:
        raise ToolError(NAME, f"Confluence answered something that is not a page for {page_id}") from exc
    from .storage_format import storage_to_text  # the HTTP module loads when a remote tool first runs

    title = " ".join(title.split()) if isinstance(title, str) else ""  # never a Python repr of a field
    text = storage_to_text(html) if isinstance(html, str) else ""
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "\n[... page truncated]"
    if not (title or text.strip()):
        raise ToolError(NAME, f"Confluence page {page_id} has no text")
    page_url = _page_url(base, links, page_id)
    return ToolResult((
        EvidenceItem(
            tool=NAME,
            source=page_url,
            text=(f"{title}\n\n{text}" if title else text).strip(),
            url=page_url,
            title=title,
        ),
    ))


def _page_url(base: str, links: Mapping[str, Any], page_id: str) -> str:
    webui = links.get("webui") if isinstance(links, Mapping) else None
    link_base = links.get("base") if isinstance(links, Mapping) else None
    if isinstance(webui, str) and webui:
        if webui.startswith(("http://", "https://")):
            return webui
        root = link_base if isinstance(link_base, str) and link_base else base
        return root.rstrip("/") + "/" + webui.lstrip("/")
    return f"{base}/pages/viewpage.action?pageId={page_id}"


def _designated(raw: Any, found: Any) -> str | None:
    """The page id a model's ``page_id`` (digits, a number or a page URL) names, if found."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    given = (text.lstrip("0") or "0",) if text.isdigit() else find_confluence_page_ids(text)
    return given[0] if given and given[0] in found else None


TOOL = Tool(
    name=NAME,
    description="fetch a Confluence page",
    run=run,
    params=(Param("page_id", required=True, hint='"123456"'),),
    question_arg=QuestionArg("page_id", find_confluence_page_ids, "a Confluence page id or page URL", _designated),
    enabled=lambda settings: bool(settings.confluence_base_url),
    enable_hint="set CONFLUENCE_BASE_URL",
)
