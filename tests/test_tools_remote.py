"""The remote tools against loopback test servers: Jira, Confluence, and web_fetch's SSRF guard."""

from __future__ import annotations

import base64
import ipaddress
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from crag.config import Settings
from crag.errors import ToolError
from crag.state import ToolCall
from crag.tools import Toolbox
from crag.tools.http import html_to_text, is_public_address

Route = Callable[[BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]]


class FakeServer:
    """A stdlib HTTP server on 127.0.0.1 (port 0) answering from ``routes``; records requests."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append((self.path, dict(self.headers.items())))
                route = outer.routes.get(self.path.split("?")[0])
                if route is None:
                    status, headers, body = 404, {"Content-Type": "application/json"}, b'{"errorMessages": ["nope"]}'
                else:
                    status, headers, body = route(self)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    servers: list[FakeServer] = []

    def make(routes: dict[str, Route]) -> FakeServer:
        s = FakeServer(routes)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def json_route(payload: object, status: int = 200, auth: str | None = None) -> Route:
    def route(handler: BaseHTTPRequestHandler):
        if auth is not None and handler.headers.get("Authorization") != auth:
            return 401, {"Content-Type": "application/json"}, b'{"message": "unauthorized"}'
        return status, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(payload).encode()

    return route


ISSUE = {
    "key": "OPS-42",
    "fields": {
        "summary": "Uploads time out behind the proxy",
        "description": "Large uploads fail after 30 seconds.\nRaise proxy_read_timeout.",
        "status": {"name": "In Progress"},
        "issuetype": {"name": "Bug"},
        "comment": {"comments": [{"author": {"displayName": "Ana"}, "body": "Fixed in staging."}]},
    },
}


def box_for(tmp_path: Path, **settings) -> Toolbox:
    return Toolbox(Settings(index_dir=str(tmp_path / "idx"), **settings), roots=[tmp_path])


def basic(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


# -- Jira ----------------------------------------------------------------------------


def test_jira_fetch_with_basic_auth(server, tmp_path: Path) -> None:
    jira = server({"/rest/api/2/issue/OPS-42": json_route(ISSUE, auth=basic("me@example.com", "s3cret"))})
    box = box_for(tmp_path, jira_base_url=jira.url, jira_email="me@example.com", jira_api_token="s3cret")
    [item] = box.run(ToolCall("jira_fetch", {"key": "ops-42"}))
    assert item.tool == "jira_fetch" and item.source == "OPS-42"
    assert item.url == f"{jira.url}/browse/OPS-42" and item.title == "Uploads time out behind the proxy"
    assert item.text.startswith("OPS-42: Uploads time out behind the proxy\nStatus: In Progress\nType: Bug")
    assert "proxy_read_timeout" in item.text and "Comment by Ana:\nFixed in staging." in item.text
    assert item.start_line is None
    path, headers = jira.requests[0]
    assert path.startswith("/rest/api/2/issue/OPS-42?fields=")
    assert headers["Authorization"] == basic("me@example.com", "s3cret")


def test_jira_fetch_with_a_bearer_token_and_its_errors(server, tmp_path: Path) -> None:
    jira = server({"/rest/api/2/issue/OPS-42": json_route(ISSUE, auth="Bearer pat-123")})
    box = box_for(tmp_path, jira_base_url=jira.url, jira_api_token="pat-123")
    assert box.run(ToolCall("jira_fetch", {"key": "OPS-42"}))[0].source == "OPS-42"
    with pytest.raises(ToolError, match="Jira issue OPS-43 was not found"):
        box.run(ToolCall("jira_fetch", {"key": "OPS-43"}))
    wrong = box_for(tmp_path, jira_base_url=jira.url, jira_api_token="wrong")
    with pytest.raises(ToolError, match=r"HTTP 401.*JIRA_API_TOKEN"):
        wrong.run(ToolCall("jira_fetch", {"key": "OPS-42"}))
    before = len(jira.requests)
    for bad in ("../../etc/passwd", "OPS-42/../../x", "OPS", "42", "OPS-42?x=1"):
        with pytest.raises(ToolError, match="not a Jira issue key"):
            box.run(ToolCall("jira_fetch", {"key": bad}))
    assert len(jira.requests) == before


def test_a_refusal_of_a_request_sent_without_a_token_says_the_token_is_not_set(server, tmp_path: Path) -> None:
    # JIRA_EMAIL alone sends no Authorization at all; the 401 said "check JIRA_EMAIL and JIRA_API_TOKEN"
    site = server({"/rest/api/2/issue/OPS-42": json_route(ISSUE, auth="Bearer pat-123"),
                   "/rest/api/content/98765": json_route(PAGE, auth="Bearer pat-123")})
    box = box_for(tmp_path, jira_base_url=site.url, jira_email="me@example.com", confluence_base_url=site.url)
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira refused the request \(HTTP 401\), which was sent without "
                                        r"credentials as JIRA_API_TOKEN is not set: set it \(with JIRA_EMAIL for Jira "
                                        r"Cloud, alone for a bearer token\)$"):
        box.run(ToolCall("jira_fetch", {"key": "OPS-42"}))
    with pytest.raises(ToolError, match=r"^confluence_fetch: Confluence refused the request \(HTTP 401\), which was "
                                        r"sent without credentials as CONFLUENCE_API_TOKEN is not set"):
        box.run(ToolCall("confluence_fetch", {"page_id": "98765"}))
    assert [h.get("Authorization") for _, h in site.requests] == [None, None]


def test_a_rate_limit_says_so_and_how_long_the_server_asked_to_wait(server, tmp_path: Path) -> None:
    # a 429 read "Jira request failed: http://.../rest/api/2/issue/OPS-42?fields=... answered HTTP 429"
    def limited(retry_after: str | None) -> Route:
        headers = {"Content-Type": "application/json"} | ({"Retry-After": retry_after} if retry_after else {})
        return lambda h: (429, headers, b'{"message": "rate limited"}')

    site = server({"/rest/api/2/issue/OPS-42": limited("30"), "/rest/api/2/issue/OPS-43": limited(None),
                   "/rest/api/content/98765": limited("Wed, 21 Oct 2015 07:28:00 GMT")})
    box = box_for(tmp_path, jira_base_url=site.url, confluence_base_url=site.url, jira_api_token="pat-123")
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira is limiting requests \(HTTP 429, asking to wait 30 s\): "
                                        r"try again later$"):
        box.run(ToolCall("jira_fetch", {"key": "OPS-42"}))
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira is limiting requests \(HTTP 429\): try again later$"):
        box.run(ToolCall("jira_fetch", {"key": "OPS-43"}))
    with pytest.raises(ToolError, match=r"^confluence_fetch: Confluence is limiting requests \(HTTP 429\): "
                                        r"try again later$"):  # a date in the past asks for no wait
        box.run(ToolCall("confluence_fetch", {"page_id": "98765"}))


def test_jira_unreachable_is_a_tool_error(tmp_path: Path) -> None:
    box = box_for(tmp_path, jira_base_url="http://127.0.0.1:9")
    with pytest.raises(ToolError, match="Jira request failed"):
        box.run(ToolCall("jira_fetch", {"key": "OPS-1"}))


# -- Confluence ------------------------------------------------------------------------


PAGE = {
    "id": "98765",
    "title": "Runbook: rotating keys",
    "body": {"storage": {"value": "<h1>Rotate</h1><p>Run <code>rotate.sh</code> every <b>90</b> days.</p><script>alert(1)</script><ul><li>step one</li><li>step two</li></ul>"}},
    "version": {"number": 7},
    "_links": {"webui": "/spaces/OPS/pages/98765/Runbook", "base": "https://wiki.example.com/wiki"},
}


def test_confluence_fetch_reduces_storage_html_and_cites_the_page_url(server, tmp_path: Path) -> None:
    wiki = server({"/rest/api/content/98765": json_route(PAGE, auth=basic("me@example.com", "tok"))})
    box = box_for(tmp_path, confluence_base_url=wiki.url, confluence_email="me@example.com", confluence_api_token="tok")
    for page_id in ("98765", 98765, "https://wiki.example.com/wiki/spaces/OPS/pages/98765/Runbook", "https://x/viewpage.action?pageId=98765"):
        [item] = box.run(ToolCall("confluence_fetch", {"page_id": page_id}))
        assert item.source == item.url == "https://wiki.example.com/wiki/spaces/OPS/pages/98765/Runbook"
        assert item.title == "Runbook: rotating keys"
        assert item.text == "Runbook: rotating keys\n\nRotate\n\nRun rotate.sh every 90 days.\n\n- step one\n\n- step two"
    path, headers = wiki.requests[0]
    assert path == "/rest/api/content/98765?expand=body.storage,version"
    assert headers["Authorization"] == basic("me@example.com", "tok")
    with pytest.raises(ToolError, match="not a Confluence page id"):
        box.run(ToolCall("confluence_fetch", {"page_id": "../admin"}))
    with pytest.raises(ToolError, match="page 11 was not found"):
        box.run(ToolCall("confluence_fetch", {"page_id": "11"}))


# -- web_fetch and the SSRF guard -----------------------------------------------------------


def loopback_only(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return str(ip) == "127.0.0.1"


def web_box(tmp_path: Path, **kw) -> Toolbox:
    return Toolbox(Settings(index_dir=str(tmp_path / "idx"), web_fetch=True), roots=[tmp_path], **kw)


def fetch(box: Toolbox, url: str):
    return box.run(ToolCall("web_fetch", {"url": url}))


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "192.168.1.10", "172.16.5.5", "100.64.0.1", "0.0.0.0",
     "::ffff:127.0.0.1", "fe80::1", "fc00::1", "224.0.0.1", "::", "192.0.0.8", "192.0.0.255", "::ffff:192.0.0.8",
     "fec0::1", "feff::1"],  # site-local (deprecated, still routed inside some networks)
)
def test_private_and_special_addresses_are_not_public(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


def test_public_addresses_are_public() -> None:
    assert is_public_address(ipaddress.ip_address("93.184.216.34"))
    assert is_public_address(ipaddress.ip_address("2606:4700:4700::1111"))
    assert is_public_address(ipaddress.ip_address("192.0.0.9"))  # anycast, globally reachable (IANA)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:{port}/page", "http://localhost:{port}/page", "http://[::1]:{port}/page", "http://2130706433:{port}/page",
     "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/", "http://[::ffff:127.0.0.1]:{port}/page"],
)
def test_web_fetch_refuses_non_public_addresses_by_default(server, tmp_path: Path, url: str) -> None:
    site = server({"/page": lambda h: (200, {"Content-Type": "text/plain"}, b"internal secret")})
    with pytest.raises(ToolError, match="not a public address"):
        fetch(web_box(tmp_path), url.format(port=site.port))
    assert site.requests == []


def test_a_dns_name_resolving_to_a_private_address_is_refused(tmp_path: Path) -> None:
    resolved = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["93.184.216.34", "10.1.2.3"] if host == "mixed.example" else ["10.1.2.3"]

    for host in ("intranet.example", "mixed.example"):
        with pytest.raises(ToolError, match=r"resolves to 10\.1\.2\.3, which is not a public address"):
            fetch(web_box(tmp_path, resolver=resolver), f"http://{host}/")
    assert resolved == ["intranet.example", "mixed.example"]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://x/", "http://user:pw@example.com/", "javascript:alert(1)"])
def test_web_fetch_refuses_other_schemes_and_credentials(tmp_path: Path, url: str) -> None:
    with pytest.raises(ToolError):
        fetch(web_box(tmp_path), url)


@pytest.mark.parametrize("url", ["http://[abc/", "http://[::1/x", "https://x]y/", "http://a:b@[/"])
def test_a_url_python_cannot_split_is_a_tool_error(tmp_path: Path, url: str) -> None:
    """``crag ask "what is at http://[abc/ please"`` with ``KB_AGENT_WEB_FETCH=on`` ended in a
    traceback (``ValueError: Invalid IPv6 URL`` from urlsplit, outside the tool's error boundary)."""
    with pytest.raises(ToolError, match="not a valid URL"):
        fetch(web_box(tmp_path), url)


def test_a_redirect_to_a_url_python_cannot_split_is_a_tool_error(server, tmp_path: Path) -> None:
    site = server({"/moved": lambda h: (302, {"Location": "http://[oops/"}, b"")})
    with pytest.raises(ToolError, match="not a valid URL"):
        fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/moved")


def test_web_fetch_reads_an_allowed_page_as_text(server, tmp_path: Path) -> None:
    html = b"<html><head><title>Status page</title><style>p{}</style></head><body><h1>All good</h1><p>Uptime is 99.9%.</p></body></html>"
    site = server({"/status": lambda h: (200, {"Content-Type": "text/html; charset=utf-8"}, html)})
    [item] = fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/status")
    assert item.tool == "web_fetch" and item.source == item.url == f"{site.url}/status"
    assert item.title == "Status page" and item.text == "All good\n\nUptime is 99.9%."


def test_a_url_of_letters_beyond_ascii_is_sent_percent_encoded_as_browsers_send_it(server, tmp_path: Path) -> None:
    """``https://de.wikipedia.org/wiki/Köln`` was the tool error "a request header (Accept-Encoding,
    User-Agent) holds characters HTTP cannot carry; check the configured credentials": http.client
    refuses a request line that is not ASCII. So was a redirect to such a URL, or one with a space."""
    page = lambda h: (200, {"Content-Type": "text/plain"}, b"Cologne lies on the Rhine.")  # noqa: E731
    site = server({"/wiki/K%C3%B6ln": page, "/alt": lambda h: (302, {"Location": "/wiki/Köln old"}, b""), "/wiki/K%C3%B6ln%20old": page})
    box = web_box(tmp_path, address_allowed=loopback_only)
    [item] = fetch(box, f"{site.url}/wiki/Köln?lang=dé")
    assert item.text == "Cologne lies on the Rhine." and item.url == f"{site.url}/wiki/Köln?lang=dé"
    [item] = fetch(box, f"{site.url}/alt")
    assert item.text == "Cologne lies on the Rhine."
    assert [path for path, _ in site.requests] == ["/wiki/K%C3%B6ln?lang=d%C3%A9", "/alt", "/wiki/K%C3%B6ln%20old"]


@pytest.mark.parametrize("charset", ["idna", "punycode", "base64", "no-such-codec"])
def test_a_page_declaring_a_charset_that_cannot_read_text_is_read_as_utf8(server, tmp_path: Path, charset) -> None:
    """``charset=idna`` (a codec that refuses to replace what it cannot decode) ended ``web_fetch``
    and the whole ask in a raw ``UnicodeError`` traceback."""
    site = server({"/p": lambda h: (200, {"Content-Type": f"text/plain; charset={charset}"}, "Uptime is 99.9% – fine.".encode())})
    [item] = fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/p")
    assert item.text == "Uptime is 99.9% – fine."


def test_a_json_array_becomes_one_item_per_element(server, tmp_path: Path) -> None:
    results = [{"title": "first", "n": 1}, {"title": "second", "n": 2}, "third"]
    site = server({"/search": json_route(results)})
    items = fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/search?q=x")
    assert [i.source for i in items] == [f"{site.url}/search?q=x#item-{n}" for n in (1, 2, 3)]
    assert json.loads(items[0].text) == {"title": "first", "n": 1} and items[2].text == "third"
    assert len({i.key for i in items}) == 3


@pytest.mark.parametrize(
    "target",
    ["http://169.254.169.254/latest/meta-data/", "http://[::1]:{port}/secret", "http://metadata.example:{port}/secret", "http://10.0.0.1/"],
)
def test_a_redirect_to_a_forbidden_address_is_refused(server, tmp_path: Path, target: str) -> None:
    site = server({})
    site.routes["/go"] = lambda h: (302, {"Location": target.format(port=site.port)}, b"")
    site.routes["/secret"] = lambda h: (200, {"Content-Type": "text/plain"}, b"internal secret")

    def resolver(host: str, port: int) -> list[str]:
        return {"metadata.example": ["169.254.169.254"]}.get(host, ["127.0.0.1"])

    with pytest.raises(ToolError, match="not a public address"):
        fetch(web_box(tmp_path, address_allowed=loopback_only, resolver=resolver), f"{site.url}/go")
    assert [p for p, _ in site.requests] == ["/go"]


def test_redirects_are_followed_a_few_times_only(server, tmp_path: Path) -> None:
    site = server({})
    site.routes["/a"] = lambda h: (301, {"Location": "/b"}, b"")
    site.routes["/b"] = lambda h: (302, {"Location": f"{site.url}/c"}, b"")
    site.routes["/c"] = lambda h: (200, {"Content-Type": "text/plain"}, b"arrived")
    site.routes["/loop"] = lambda h: (302, {"Location": "/loop"}, b"")
    box = web_box(tmp_path, address_allowed=loopback_only)
    [item] = fetch(box, f"{site.url}/a")
    assert item.text == "arrived" and item.source == f"{site.url}/c"
    with pytest.raises(ToolError, match="too many redirects"):
        fetch(box, f"{site.url}/loop")
    assert sum(1 for p, _ in site.requests if p == "/loop") == 4


def test_big_pages_are_cut_and_binary_is_refused(server, tmp_path: Path) -> None:
    site = server(
        {
            "/big": lambda h: (200, {"Content-Type": "text/plain"}, b"a" * (3 * 1024 * 1024)),
            "/img": lambda h: (200, {"Content-Type": "image/png"}, b"\x89PNG"),
        }
    )
    box = web_box(tmp_path, address_allowed=loopback_only)
    [item] = fetch(box, f"{site.url}/big")
    assert item.text.endswith("[... cut at 1024 KiB]") and len(item.text) < 100_000
    with pytest.raises(ToolError, match="image/png, not text"):
        fetch(box, f"{site.url}/img")


def test_a_cut_page_without_text_is_an_error_not_an_item_of_the_cut_alone(server, tmp_path: Path) -> None:
    # a page whose first MiB is an inline script bundle (or blank) became an item whose whole
    # text was "[... cut at 1024 KiB]", graded and cited as if the page said something
    script = b"<html><head><script>" + b"var a = 1;\n" * (200 * 1024) + b"</script></head><body>Hi</body></html>"
    site = server({"/app": lambda h: (200, {"Content-Type": "text/html"}, script),
                   "/blank": lambda h: (200, {"Content-Type": "text/plain"}, b" " * (2 * 1024 * 1024))})
    box = web_box(tmp_path, address_allowed=loopback_only)
    for path in ("/app", "/blank"):
        with pytest.raises(ToolError, match=rf"^web_fetch: {site.url}{path} has no text in its first 1024 KiB$"):
            fetch(box, f"{site.url}{path}")


def test_html_to_text_drops_scripts_and_keeps_blocks() -> None:
    title, text = html_to_text("<title>T</title><div>a<script>var x = '<p>no</p>';</script></div><p>b &amp; c</p>")
    assert title == "T" and text == "a\n\nb & c"


def test_a_refusal_after_a_redirect_to_another_origin_is_not_blamed_on_the_credentials(server, tmp_path: Path) -> None:
    # crag deliberately sends no credentials to a redirect's other origin: its 401 said "check
    # JIRA_EMAIL and JIRA_API_TOKEN", which were right
    auth = basic("me@example.com", "s3cret")
    other = server({"/rest/api/2/issue/OPS-42": json_route(ISSUE, auth=auth),
                    "/rest/api/content/98765": json_route(PAGE, auth=auth)})
    jira = server({"/rest/api/2/issue/OPS-42": lambda h: (301, {"Location": f"{other.url}{h.path}"}, b""),
                   "/rest/api/content/98765": lambda h: (302, {"Location": f"{other.url}{h.path}"}, b"")})
    box = box_for(tmp_path, jira_base_url=jira.url, jira_email="me@example.com", jira_api_token="s3cret",
                  confluence_base_url=jira.url, confluence_email="me@example.com", confluence_api_token="s3cret")
    with pytest.raises(ToolError) as caught:
        box.run(ToolCall("jira_fetch", {"key": "OPS-42"}))
    assert str(caught.value) == (
        f"jira_fetch: Jira redirected the request to {other.url}, which refused it (HTTP 401) without credentials: "
        "crag sends JIRA_EMAIL and JIRA_API_TOKEN only to the scheme, host and port of JIRA_BASE_URL "
        "(set JIRA_BASE_URL to that address if Jira is served there)")
    with pytest.raises(ToolError, match=rf"^confluence_fetch: Confluence redirected the request to {other.url}, "
                       r"which refused it \(HTTP 401\) without credentials: crag sends CONFLUENCE_EMAIL"):
        box.run(ToolCall("confluence_fetch", {"page_id": "98765"}))
    assert [h.get("Authorization") for _, h in other.requests] == [None, None]
    assert [h.get("Authorization") for _, h in jira.requests] == [auth, auth]
    same = box_for(tmp_path, jira_base_url=other.url, jira_email="me@example.com", jira_api_token="wrong")
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira refused the request \(HTTP 401\): check JIRA_EMAIL"):
        same.run(ToolCall("jira_fetch", {"key": "OPS-42"}))


STORAGE = (
    '<h1>Failover</h1><p>Run the script.</p>'
    '<ac:structured-macro ac:name="code" ac:schema-version="1"><ac:parameter ac:name="language">bash</ac:parameter>'
    '<ac:parameter ac:name="title">Failover</ac:parameter><ac:plain-text-body><![CDATA[if [ "$x" -lt 2 ] && y; then\n'
    '    failover --region eu-west-1 --force\nfi]]></ac:plain-text-body></ac:structured-macro>'
    '<ac:structured-macro ac:name="info"><ac:parameter ac:name="title">Note</ac:parameter>'
    '<ac:rich-text-body><p>It takes 4 minutes.</p></ac:rich-text-body></ac:structured-macro>'
    '<p>The drill is on <time datetime="2025-03-14" />.</p>'
    '<p>Read the <ac:link><ri:page ri:content-title="DR plan" /><ac:plain-text-link-body>'
    '<![CDATA[recovery runbook]]></ac:plain-text-link-body></ac:link> and <ac:link><ri:page ri:content-title="DR plan" />'
    '</ac:link> first.</p><p>Owner: <ac:link><ri:user ri:account-id="5b10ac8d82e05b22cc7d4ef5" /></ac:link></p>'
    '<ac:structured-macro ac:name="noformat"><ac:plain-text-body><![CDATA[FAILOVER_MODE=active-passive]]>'
    '</ac:plain-text-body></ac:structured-macro>'
)


def test_confluence_storage_format_keeps_code_dates_links_and_mentions(server, tmp_path: Path) -> None:
    # a code macro read as "bash" with its command gone; dates, link texts, noformat bodies and
    # mentions were lost too, and a macro's parameters were shown as text (but for the titles the
    # page shows)
    wiki = server({"/rest/api/content/7": json_route({"title": "Runbook", "body": {"storage": {"value": STORAGE}}})})
    [item] = box_for(tmp_path, confluence_base_url=wiki.url).run(ToolCall("confluence_fetch", {"page_id": "7"}))
    assert item.text == (
        "Runbook\n\nFailover\n\nRun the script.\n\nFailover\n\n"  # the code block's title, as the page shows it
        '```bash\nif [ "$x" -lt 2 ] && y; then\n    failover --region eu-west-1 --force\nfi\n```\n\n'
        "Note\n\nIt takes 4 minutes.\n\nThe drill is on 2025-03-14.\n\n"
        "Read the recovery runbook and DR plan first.\n\nOwner: @5b10ac8d82e05b22cc7d4ef5\n\n"
        "```\nFAILOVER_MODE=active-passive\n```")


def test_confluence_parameters_the_page_shows_are_read_and_an_open_body_ends_with_its_macro() -> None:
    # every parameter was left out: a status lozenge's text, a jira macro's key and a panel's or
    # an expand's title went with them; a code body left open swallowed the rest of the page
    from crag.tools.storage_format import storage_to_text

    page = (
        '<p>Status: <ac:structured-macro ac:name="status"><ac:parameter ac:name="colour">Green</ac:parameter>'
        '<ac:parameter ac:name="title">DEPRECATED</ac:parameter></ac:structured-macro></p>'
        '<p>Tracked in <ac:structured-macro ac:name="jira"><ac:parameter ac:name="server">System JIRA</ac:parameter>'
        '<ac:parameter ac:name="key">OPS-42</ac:parameter></ac:structured-macro>.</p>'
        '<ac:structured-macro ac:name="warning"><ac:parameter ac:name="title">Never restart the pump</ac:parameter>'
        '<ac:rich-text-body><p>It corrupts the WAL.</p></ac:rich-text-body></ac:structured-macro>'
        '<ac:structured-macro ac:name="code"><ac:parameter ac:name="language">bash</ac:parameter>'
        '<ac:plain-text-body><![CDATA[pump-restore --latest]]></ac:structured-macro>'
        '<h2>Restore</h2><p>It takes 40 minutes.</p>'
    )
    assert storage_to_text(page) == (
        "Status: DEPRECATED\n\nTracked in OPS-42.\n\nNever restart the pump\n\nIt corrupts the WAL.\n\n"
        "```bash\npump-restore --latest\n```\n\nRestore\n\nIt takes 40 minutes.")


def test_adf_line_breaks_mentions_and_cards_are_read(server, tmp_path: Path) -> None:
    # a hardBreak glued "line one" to "line two"; a mention and an inline card were dropped
    text = [{"type": "text", "text": "line one"}, {"type": "hardBreak"}, {"type": "text", "text": "line two, ask"},
            {"type": "mention", "attrs": {"id": "5b10", "text": "@Carol"}}, {"type": "text", "text": " or see"},
            {"type": "inlineCard", "attrs": {"url": "https://status.example.com/x"}}, {"type": "text", "text": "."}]
    issue = {"fields": {"summary": "s", "description": {"type": "doc", "content": [{"type": "paragraph", "content": text}]}}}
    jira = server({"/rest/api/2/issue/OPS-1": json_route(issue)})
    [item] = box_for(tmp_path, jira_base_url=jira.url).run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    assert item.text == "OPS-1: s\n\nline one\nline two, ask @Carol or see https://status.example.com/x."
