"""What jira_fetch and confluence_fetch share: credentials and one GET with errors a user can act on."""

from __future__ import annotations

import base64
import json
from typing import Any

from ..errors import ToolError

MAX_BYTES = 4 * 1024 * 1024


def auth_headers(email: str, token: str) -> dict[str, str]:
    """Basic auth for email + token (Cloud), bearer for a token alone (Server / DC)."""
    if email and token:
        raw = base64.b64encode(f"{email}:{token}".encode()).decode("ascii")
        return {"Authorization": f"Basic {raw}"}
    if token:
        return {"Authorization": f"Bearer {token}"}
    return {}


def get_json(tool: str, service: str, env: str, url: str, email: str, token: str, timeout: float,
             missing: str, max_bytes: int = MAX_BYTES) -> Any:
    """GET ``url`` as JSON. ``env`` is the settings prefix (``JIRA``), ``missing`` what a 404 means."""
    from .http import FetchError, http_get  # the HTTP client loads when a remote tool first runs

    try:
        resp = http_get(
            url,
            headers={"Accept": "application/json"},
            auth_headers=auth_headers(email, token),
            timeout=timeout,
            max_bytes=max_bytes,
        )
    except FetchError as exc:
        if exc.status in (401, 403) and exc.withheld_from:
            raise ToolError(
                tool, f"{service} redirected the request to {exc.withheld_from}, which refused it (HTTP {exc.status}) "
                f"without credentials: crag sends {env}_EMAIL and {env}_API_TOKEN only to the scheme, host and "
                f"port of {env}_BASE_URL (set {env}_BASE_URL to that address if {service} is served there)"
            ) from exc
        if exc.status in (401, 403) and not token:  # JIRA_EMAIL alone sends nothing: email + token is basic auth
            raise ToolError(
                tool, f"{service} refused the request (HTTP {exc.status}), which was sent without credentials as "
                f"{env}_API_TOKEN is not set: set it (with {env}_EMAIL for {service} Cloud, alone for a bearer token)"
            ) from exc
        if exc.status in (401, 403):
            raise ToolError(
                tool, f"{service} refused the request (HTTP {exc.status}): check {env}_EMAIL and {env}_API_TOKEN"
            ) from exc
        if exc.status == 429:
            wait = exc.retry_after
            asked = f", asking to wait {wait:.0f} s" if wait is not None and 1 <= wait < 86400 * 365 else ""
            raise ToolError(tool, f"{service} is limiting requests (HTTP 429{asked}): try again later") from exc
        if exc.status == 404:
            raise ToolError(tool, f"{missing} was not found (or is not visible with these credentials)") from exc
        raise ToolError(tool, f"{service} request failed: {exc}") from exc
    try:
        return json.loads(resp.text())
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than Python parses
        if "html" in resp.content_type:  # a sign-in page of a proxy, or a web page of another path than the API's
            raise ToolError(tool, f"{service} answered a web page, not JSON, for {missing} (a sign-in page or the "
                            f"address of another site?): check that {env}_BASE_URL is {service}'s address") from exc
        raise ToolError(tool, f"{service} answered something that is not JSON for {missing}") from exc
