"""``jira_fetch(key)``: one Jira issue as evidence (on when ``JIRA_BASE_URL`` is set).

GET ``{JIRA_BASE_URL}/rest/api/2/issue/{key}`` with basic auth (``JIRA_EMAIL`` +
``JIRA_API_TOKEN``, Jira Cloud) or a bearer token (``JIRA_API_TOKEN`` alone, Server / Data
Center). The key must look like ``PROJ-123``, so nothing from the model reaches the URL
but a validated key. The item's source is the key, its URL the issue's browse page, its
text the summary, status, type, description and the latest comments, cut at ``MAX_TEXT``
characters. An answer that is not an issue object is a ``ToolError``; a field that is not
text (nor Atlassian Document Format) is left out, never shown as a Python value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ToolError
from ..prompts.find import find_jira_keys
from ..state import EvidenceItem
from ..toolspec import Param, QuestionArg, Tool, ToolContext, ToolResult
from .atlassian import get_json

NAME = "jira_fetch"
KEY = re.compile(r"^[A-Z][A-Z0-9_]{0,31}-[1-9][0-9]{0,9}$")
MAX_COMMENTS = 5
MAX_TEXT = 60_000  # as a Confluence page: an issue can hold megabytes of pasted logs
FIELDS = "summary,description,status,issuetype,priority,assignee,comment"


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    key = args["key"].upper()
    if not KEY.match(key):
        raise ToolError(NAME, f"{key!r} is not a Jira issue key (expected something like PROJ-123)")
    settings = context.settings
    base = settings.jira_base_url
    if not base:
        raise ToolError(NAME, "Jira is not configured: set JIRA_BASE_URL")
    url = f"{base}/rest/api/2/issue/{key}?fields={FIELDS}"
    data = get_json(NAME, "Jira", "JIRA", url, settings.jira_email, settings.jira_api_token, context.http.timeout,
                    f"Jira issue {key}")
    fields = data.get("fields") if isinstance(data, Mapping) else None
    if not isinstance(fields, Mapping):
        raise ToolError(NAME, f"Jira answered something that is not an issue for {key}")
    summary = _s(fields.get("summary"))
    lines = [f"{key}: {summary}" if summary else key]
    for label, name in (("Status", "status"), ("Type", "issuetype"), ("Priority", "priority"), ("Assignee", "assignee")):
        value = fields.get(name)
        if isinstance(value, Mapping):
            value = value.get("name") or value.get("displayName")
        if isinstance(value, str) and value.strip():  # a name that is not text is left out
            lines.append(f"{label}: {value.strip()}")
    description = _s(fields.get("description"))
    if description:
        lines += ["", description]
    comment = fields.get("comment")
    comments = comment.get("comments") if isinstance(comment, Mapping) else None
    for c in comments[-MAX_COMMENTS:] if isinstance(comments, list) else ():
        if isinstance(c, Mapping):
            author = c.get("author")
            name = author.get("displayName") if isinstance(author, Mapping) else None
            name = name.strip() if isinstance(name, str) else ""
            lines += ["", f"Comment by {name or 'someone'}:", _s(c.get("body"))]
    text = "\n".join(lines).strip()
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "\n[... issue truncated]"
    return ToolResult((
        EvidenceItem(
            tool=NAME,
            source=_issue_key(data.get("key"), key),
            text=text,
            url=f"{base}/browse/{key}",
            title=summary,
        ),
    ))


def _issue_key(answered: Any, asked: str) -> str:
    """The key Jira answered with (a moved issue has a new one) when it is a key, else the one asked for."""
    if isinstance(answered, str) and KEY.match(answered.strip().upper()):
        return answered.strip().upper()
    return asked


def _s(value: Any) -> str:
    """Text of a field: strings as they are, Atlassian document format flattened; anything else
    (a number, a list of strings) is left out, never shown as a Python value."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (Mapping, list)):  # Atlassian Document Format (API v3-style bodies), or its nodes
        parts: list[str] = []
        _adf_text(value, parts)
        return "".join(parts).strip()
    return ""


def _adf_text(node: Any, parts: list[str]) -> None:
    if isinstance(node, Mapping):
        kind, attrs = node.get("type"), node.get("attrs")
        if kind == "text" and isinstance(node.get("text"), str):
            parts.append(node["text"])
        elif kind == "hardBreak":
            parts.append("\n")
        elif kind in ("mention", "inlineCard") and isinstance(attrs, Mapping):
            shown = attrs.get("text" if kind == "mention" else "url")  # "@Carol"; the card's URL
            if isinstance(shown, str) and shown.strip():
                if parts and not parts[-1][-1:].isspace():  # a word of its own, not glued to the last
                    parts.append(" ")
                parts.append(shown.strip())
        content = node.get("content")
        for child in content if isinstance(content, list) else ():  # a server's reply is input: any shape
            _adf_text(child, parts)
        if node.get("type") in ("paragraph", "heading", "listItem", "codeBlock"):
            parts.append("\n")
    elif isinstance(node, list):
        for child in node:
            _adf_text(child, parts)


def _designated(raw: Any, found: Any) -> str | None:
    key = raw.strip().upper() if isinstance(raw, str) else None
    return key if key in found else None


TOOL = Tool(
    name=NAME,
    description="fetch a Jira issue",
    run=run,
    params=(Param("key", required=True, max_length=64, hint='"ABC-123"'),),
    question_arg=QuestionArg("key", find_jira_keys, "a Jira key (like ABC-123)", _designated),
    enabled=lambda settings: bool(settings.jira_base_url),
    enable_hint="set JIRA_BASE_URL",
)
