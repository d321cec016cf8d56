"""The remote tools against servers that answer badly: JSON of the wrong shape, JSON nested past
what Python parses, enormous issues and binary bodies. Each is one ``ToolError`` or a bounded
item, never another exception (which would end ``crag ask`` with a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crag.errors import ToolError
from crag.state import ToolCall
from tests.test_tools_remote import box_for, fetch, json_route, loopback_only, server, web_box

__all__ = ["server"]  # the fixture, shared with test_tools_remote

DEEP = ("[" * 100_000 + "]" * 100_000).encode()  # json.loads raises RecursionError, not ValueError


def raw(body: bytes, content_type: str = "application/json"):
    return lambda handler: (200, {"Content-Type": content_type}, body)


@pytest.mark.parametrize(
    "payload",
    [
        {"fields": []},
        {"fields": None},
        {"fields": "summary"},
        {"fields": {"summary": "s", "comment": {"comments": {"0": {"body": "c"}}}}},
        {"fields": {"summary": "s", "comment": {"comments": "not a list"}}},
        {"fields": {"summary": "s", "comment": []}},
    ],
)
def test_a_jira_answer_that_is_not_an_issue_is_a_tool_error_or_an_item(server, tmp_path: Path, payload) -> None:
    jira = server({"/rest/api/2/issue/OPS-1": json_route(payload)})
    box = box_for(tmp_path, jira_base_url=jira.url)
    try:
        [item] = box.run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    except ToolError as exc:
        assert str(exc) == "jira_fetch: Jira answered something that is not an issue for OPS-1"
    else:
        assert item.text.startswith("OPS-1: s")


@pytest.mark.parametrize(
    "description",
    [
        {"type": "doc", "content": 5},
        {"type": "doc", "content": "text"},
        {"type": "doc", "content": [{"type": "text", "text": 5}, {"type": ["paragraph"], "content": {"a": 1}}, None, 7]},
        {"type": {"x": 1}, "content": [{"type": "paragraph", "content": True}]},
    ],
)
def test_an_adf_description_of_another_shape_is_read_leniently(server, tmp_path: Path, description) -> None:
    # {"type": "doc", "content": 5} ended `crag ask` in a traceback (TypeError: 'int' object is
    # not iterable) and MCP's ask in "Error executing tool ask"
    issue = {"fields": {"summary": "s", "description": description,
                        "comment": {"comments": [{"body": {"type": "doc", "content": 5}}]}}}
    jira = server({"/rest/api/2/issue/OPS-1": json_route(issue)})
    [item] = box_for(tmp_path, jira_base_url=jira.url).run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    assert item.text.startswith("OPS-1: s")


def test_json_nested_past_the_parser_is_a_tool_error(server, tmp_path: Path) -> None:
    site = server({"/rest/api/2/issue/OPS-1": raw(DEEP), "/rest/api/content/123": raw(DEEP)})
    jira = box_for(tmp_path, jira_base_url=site.url)
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira answered something that is not JSON for Jira issue OPS-1"):
        jira.run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    wiki = box_for(tmp_path, confluence_base_url=site.url)
    with pytest.raises(ToolError, match=r"^confluence_fetch: Confluence answered something that is not JSON"):
        wiki.run(ToolCall("confluence_fetch", {"page_id": "123"}))


def test_a_web_page_instead_of_json_points_at_the_base_url(server, tmp_path: Path) -> None:
    # an SSO proxy's sign-in page (HTTP 200) read "Jira answered something that is not JSON"
    page = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>...</form></body></html>"
    site = server({"/rest/api/2/issue/OPS-1": raw(page, "text/html; charset=utf-8"),
                   "/rest/api/content/123": raw(page, "text/html")})
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira answered a web page, not JSON, for Jira issue OPS-1 \(a "
                                        r"sign-in page or the address of another site\?\): check that JIRA_BASE_URL "
                                        r"is Jira's address$"):
        box_for(tmp_path, jira_base_url=site.url).run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    with pytest.raises(ToolError, match=r"^confluence_fetch: Confluence answered a web page, not JSON, for Confluence "
                                        r"page 123 .*check that CONFLUENCE_BASE_URL is Confluence's address$"):
        box_for(tmp_path, confluence_base_url=site.url).run(ToolCall("confluence_fetch", {"page_id": "123"}))


def test_a_compressed_body_crag_did_not_ask_for_is_an_error_that_says_so(server, tmp_path: Path) -> None:
    # crag asks for identity and never inflates (a gzip bomb stays its few bytes); a server that
    # compressed anyway read as "... is binary, not text" or "Jira answered something that is not JSON"
    import gzip

    bomb = gzip.compress(b" " * (10 * 1024 * 1024))

    def gz(handler):
        return 200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, bomb

    site = server({"/page": gz, "/rest/api/2/issue/OPS-1": gz})
    with pytest.raises(ToolError, match=r"^web_fetch: .*/page sent its body compressed \(gzip\) although crag asked "
                                        r"for it uncompressed \(Accept-Encoding: identity\); crag does not decompress"):
        fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/page")
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira request failed: .* sent its body compressed \(gzip\)"):
        box_for(tmp_path, jira_base_url=site.url).run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    assert all(h["Accept-Encoding"] == "identity" for _, h in site.requests)


def test_a_web_page_of_json_nested_past_the_parser_is_read_as_text(server, tmp_path: Path) -> None:
    site = server({"/deep": raw(DEEP)})
    [item] = fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/deep")
    assert item.text.startswith("[[[[") and item.text.endswith("[... truncated]") and len(item.text) < 50_000


def test_an_enormous_jira_issue_is_cut_like_a_confluence_page(server, tmp_path: Path) -> None:
    issue = {"fields": {"summary": "big", "description": "word " * 500_000,
                        "comment": {"comments": [{"body": "note " * 100_000}] * 3}}}
    jira = server({"/rest/api/2/issue/OPS-1": json_route(issue)})
    [item] = box_for(tmp_path, jira_base_url=jira.url).run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    assert item.text.startswith("OPS-1: big\n\nword word")
    assert item.text.endswith("[... issue truncated]") and len(item.text) < 70_000


@pytest.mark.parametrize("content_type", ["", "text/plain", "text/html"])
def test_a_binary_body_is_not_text_whatever_its_content_type(server, tmp_path: Path, content_type: str) -> None:
    site = server({"/blob": raw(b"\x7fELF\x02\x01\x01\x00\x00\x00garbage\xff\xfe" * 50, content_type)})
    with pytest.raises(ToolError, match=r"^web_fetch: http://127\.0\.0\.1:\d+/blob is binary, not text$"):
        fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/blob")


def test_a_confluence_page_of_the_wrong_shape_keeps_no_python_reprs(server, tmp_path: Path) -> None:
    page = {"title": {"text": "T"}, "body": {"storage": {"value": ["<p>a</p>"]}}, "_links": []}
    wiki = server({"/rest/api/content/123": json_route(page)})
    box = box_for(tmp_path, confluence_base_url=wiki.url)
    with pytest.raises(ToolError, match=r"^confluence_fetch: Confluence page 123 has no text$"):
        box.run(ToolCall("confluence_fetch", {"page_id": "123"}))
    assert json.dumps(page)  # the payload itself is plain JSON: only its shape is wrong


_HTML_WORK = """
import resource, sys
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))  # CPU seconds: the quadratic parse takes many minutes
from crag.tools.http import html_to_text
title, text = html_to_text(sys.argv[1] * (1024 * 1024 // len(sys.argv[1])))
assert text.startswith(sys.argv[1] * 3), text[:40]
"""


@pytest.mark.parametrize("unit", ["<a", "</", "<?"])
def test_html_ending_in_tags_that_never_close_is_read_in_one_pass(unit: str) -> None:
    # html.parser rescans the rest of the document for every "<" that no ">" follows: a 1 MiB
    # page of "<a" (what web_fetch reads at most) held a question for many minutes, with the
    # deadline long passed (the body was already read). Measured in CPU seconds, with a margin
    # of a hundred times what the linear reading takes.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _HTML_WORK, unit], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr[-500:] or f"killed by signal {-done.returncode}"


def test_a_web_page_of_unclosed_tags_keeps_its_characters(server, tmp_path: Path) -> None:
    site = server({"/tags": raw(b"<p>intro</p>" + b"<a" * 200_000, "text/html")})
    [item] = fetch(web_box(tmp_path, address_allowed=loopback_only), f"{site.url}/tags")
    assert item.text.startswith("intro\n<a<a<a") and item.text.endswith("[... truncated]")


_OPEN_TAGS = """
import resource, sys
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
from crag.tools.http import html_to_text
title, text = html_to_text("<p>intro</p>" + "<a b='>' " * (1024 * 1024 // 9))
assert text == "intro", text[:40]
"""


def test_html_of_tags_a_quoted_gt_leaves_open_is_read_in_one_pass() -> None:
    # Every '<a' of "<a b='>' <a b='>' ..." opens a tag that never ends (its '>' is quoted):
    # html.parser re-scanned the rest of the page from each (minutes for a 1 MiB page). As in a
    # browser, the first such tag now runs to the end of the page. Measured in CPU seconds.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _OPEN_TAGS], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr[-500:] or f"killed by signal {-done.returncode}"


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (what a test or internal server has)."""
    import datetime

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_a_certificate_that_fails_verification_is_a_tls_error(server, tmp_path: Path) -> None:
    # ssl.SSLCertVerificationError is a ValueError: it was taken for a header http.client refuses
    # and reported as "a request header (...) holds characters HTTP cannot carry; check the
    # configured credentials", for web_fetch too, which sends none
    import ssl

    site = server({"/rest/api/2/issue/OPS-1": json_route({"fields": {"summary": "s"}}),
                   "/rest/api/content/1": json_route({"title": "t"}),
                   "/page": raw(b"text", "text/plain")})
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_self_signed(tmp_path))
    site.httpd.socket = context.wrap_socket(site.httpd.socket, server_side=True)
    url = site.url.replace("http://", "https://")
    tls = r"TLS error talking to 127\.0\.0\.1: CERTIFICATE_VERIFY_FAILED: self.signed certificate$"
    with pytest.raises(ToolError, match=r"^jira_fetch: Jira request failed: " + tls):
        box_for(tmp_path, jira_base_url=url, jira_api_token="tok").run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    with pytest.raises(ToolError, match=r"^confluence_fetch: Confluence request failed: " + tls):
        box_for(tmp_path, confluence_base_url=url).run(ToolCall("confluence_fetch", {"page_id": "1"}))
    with pytest.raises(ToolError, match=r"^web_fetch: " + tls):
        fetch(web_box(tmp_path, address_allowed=loopback_only), f"{url}/page")


def test_the_basic_credential_a_server_echoes_in_a_redirect_is_masked(server, tmp_path: Path) -> None:
    # what crag sends for JIRA_EMAIL + JIRA_API_TOKEN is base64 of "email:token", the token as
    # plainly as the token itself: a Location echoing it was printed in the tool error
    import base64
    from urllib.parse import quote

    sent = base64.b64encode(b"me@example.com:Zq9>?~tok3n").decode()
    assert "+" in sent and sent.endswith("=")  # so each form below differs from the others
    forms = (sent, quote(sent, safe=""), sent.replace("+", "-").replace("/", "_"))
    def to(location: str):
        return lambda handler: (302, {"Location": location}, b"")

    site = server({f"/rest/api/2/issue/OPS-{n}": to(f"http://127.0.0.1:1/x?h={form}") for n, form in enumerate(forms, 1)})
    site.routes["/rest/api/content/1"] = to(f"http://127.0.0.1:1/{sent}")
    box = box_for(tmp_path, jira_base_url=site.url, jira_email="me@example.com", jira_api_token="Zq9>?~tok3n",
                  confluence_base_url=site.url, confluence_email="me@example.com", confluence_api_token="Zq9>?~tok3n")
    calls = [ToolCall("jira_fetch", {"key": f"OPS-{n}"}) for n in (1, 2, 3)] + [ToolCall("confluence_fetch", {"page_id": "1"})]
    for call in calls:
        with pytest.raises(ToolError) as caught:
            box.run(call)
        assert "cannot fetch http://127.0.0.1:1/" in str(caught.value) and "***" in str(caught.value)
        assert not any(form[:12] in str(caught.value) for form in forms), str(caught.value)


def test_the_basic_credential_of_an_email_and_a_token_set_apart_is_a_secret(tmp_path: Path) -> None:
    import base64

    from crag.config import secret_values

    dotenv = tmp_path / ".env"
    dotenv.write_text("CONFLUENCE_API_TOKEN=Zq9>?~tok3n\n")
    secrets = secret_values({"CONFLUENCE_EMAIL": "me@example.com"}, dotenv)
    assert base64.b64encode(b"me@example.com:Zq9>?~tok3n").decode() in secrets


def test_jira_fields_that_are_not_text_are_left_out(server, tmp_path: Path) -> None:
    # they were shown as Python values: "['a', 'list', 'eviction']", "Comment by ['x']:", "5"
    issue = {"fields": {"summary": {"x": 1}, "description": ["a", "list", "eviction"], "status": {"name": ["Open"]},
                        "issuetype": 7, "priority": {"name": True}, "assignee": {"displayName": "Ann"},
                        "comment": {"comments": [{"author": "string", "body": 5},
                                                 {"author": {"displayName": ["x"]}, "body": "noted"}]}}}
    jira = server({"/rest/api/2/issue/OPS-1": json_route(issue)})
    [item] = box_for(tmp_path, jira_base_url=jira.url).run(ToolCall("jira_fetch", {"key": "OPS-1"}))
    assert item.text == "OPS-1\nAssignee: Ann\n\nComment by someone:\n\n\nComment by someone:\nnoted"
    assert item.title == ""
