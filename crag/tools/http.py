"""HTTP GET for the remote tools, with an SSRF guard, redirect, size and time limits.

Built on the standard library's ``http.client`` so that every connection is under crag's
control:

* the host name is resolved once per hop, every address it resolves to is checked with
  ``address_allowed`` (a refused one fails the whole request), and the connection goes to
  the checked address itself (with the original ``Host`` header and TLS server name), so a
  DNS answer cannot change between the check and the connection;
* redirects (at most ``max_redirects``) are followed by hand and each hop is checked
  again; credentials (``auth_headers``) are only ever sent to the first URL's origin;
* the body is read up to ``max_bytes``; the whole exchange has a deadline: a watchdog
  shuts the connection down when it passes, so a server trickling bytes cannot hold it,
  and a name the resolver has not resolved by then is a timeout too;
* a header value HTTP cannot carry (a token with a newline or a non-ASCII character) is a
  ``FetchError`` that does not repeat the value;
* no proxy and no compression is used, so what is checked is what is fetched (a body sent
  compressed all the same is a ``FetchError`` saying so: it is never inflated).

``is_public_address`` is the default guard for ``web_fetch``: only globally routable
unicast addresses pass (loopback, private, link-local such as 169.254.169.254, IPv6 site-local, CGNAT,
multicast, reserved, unspecified, IPv4-mapped and 6to4 forms of those are refused).
Jira and Confluence use no guard: their base URLs are configured by the user and are often
internal hosts; only the issue key or page id comes from the model, and it is validated.

``html_to_text`` reduces HTML to readable text with ``html.parser``, in one pass: a ``<`` that
no ``>`` follows is text (``_unopened``), and a tag, comment or declaration that never ends
runs to the end of the page, as in a browser (``TextExtractor.close``).
"""

from __future__ import annotations

import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from html.parser import HTMLParser
from urllib.parse import quote, urljoin, urlsplit

from attrs import frozen

from ..llm.retry import parse_retry_after

__all__ = [
    "FetchError",
    "Response",
    "TextExtractor",
    "html_to_text",
    "http_get",
    "is_public_address",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressPolicy = Callable[[IPAddress], bool]
Resolver = Callable[[str, int], Sequence[str]]

USER_AGENT = "crag/0.1 (+https://github.com/; knowledge-base agent)"


class FetchError(Exception):
    """A request failed; ``str`` is one line, ``status`` the HTTP status when there was one.
    ``withheld_from`` is the origin (``https://host:port``) that answered with ``status`` without
    having been sent the ``auth_headers`` (a redirect led to another origin), else None.
    ``retry_after`` the seconds its ``Retry-After`` asked to wait (a 429's), else None."""

    def __init__(self, message: str, status: int | None = None, withheld_from: str | None = None,
                 retry_after: float | None = None) -> None:
        self.status = status
        self.withheld_from = withheld_from
        self.retry_after = retry_after
        super().__init__(message)


@frozen
class Response:
    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool

    @property
    def encoding(self) -> str | None:
        """The codec the body is said to be in: its byte order mark's, else the charset of its
        ``Content-Type``; None when neither says (a mark outranks the header, as in browsers)."""
        for mark, codec in _BOMS:
            if self.body.startswith(mark):
                return codec
        return self.charset

    def text(self, fallback: str = "utf-8") -> str:
        """The body as text, in ``encoding`` (its byte order mark dropped), else in ``fallback``."""
        body, codec = self.body, self.encoding or fallback
        for mark, _ in _BOMS:
            if body.startswith(mark):
                body = body[len(mark):]
        try:
            return body.decode(codec, errors="replace")
        except (LookupError, UnicodeError, ValueError):  # a codec that refuses some bytes even so
            return body.decode("utf-8", errors="replace")


# The byte order marks of the Unicode encodings a page can be in, and the codec each names.
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


_IETF_PROTOCOL = ipaddress.ip_network("192.0.0.0/24")
_GLOBAL_ANYCAST = (ipaddress.ip_address("192.0.0.9"), ipaddress.ip_address("192.0.0.10"))


def is_public_address(ip: IPAddress) -> bool:
    """True only for globally routable unicast addresses."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return is_public_address(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            return is_public_address(ip.sixtofour)
        if ip.teredo is not None or ip.is_site_local:  # fec0::/10: deprecated, yet routed inside some networks
            return False
    if isinstance(ip, ipaddress.IPv4Address) and ip in _IETF_PROTOCOL and ip not in _GLOBAL_ANYCAST:
        return False  # IANA's special-purpose block, which older Pythons call global past 192.0.0.7
    return bool(
        ip.is_global
        and not ip.is_private
        and not ip.is_loopback
        and not ip.is_link_local
        and not ip.is_multicast
        and not ip.is_reserved
        and not ip.is_unspecified
    )


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (IPv4 and IPv6)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0]).split("%", 1)[0]
        if addr not in seen:
            seen.append(addr)
    return seen


class _Watchdog:
    """Shuts a connection's socket down at a deadline, waking any read or write blocked on it."""

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            fired = self.fired
        if fired:
            self._shutdown(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._sock
        if sock is not None:
            self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a fixed, already checked address."""

    def __init__(self, address: str, host: str, port: int, timeout: float, watchdog: _Watchdog) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address
        self._watchdog = watchdog

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
        self._watchdog.watch(self.sock)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to a fixed address, verifying the certificate for ``host``."""

    def __init__(self, address: str, host: str, port: int, timeout: float, context: ssl.SSLContext,
                 watchdog: _Watchdog) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._ctx = context
        self._watchdog = watchdog

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self._watchdog.watch(sock)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self.host)


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


_URL_ASCII = "".join(chr(c) for c in range(0x21, 0x7F))  # printable ASCII but the space: kept as it is


def _check_url(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise FetchError(f"not a valid URL: {url!r}") from exc
    if parts.scheme not in ("http", "https"):
        raise FetchError(f"only http:// and https:// URLs can be fetched, not {url!r}")
    if not parts.hostname:
        raise FetchError(f"the URL {url!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise FetchError("URLs with a user name or password are refused")
    port = port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    # As browsers send it: letters beyond ASCII, spaces and control characters percent-encoded
    # as UTF-8 (http.client refuses a request line that is not ASCII), the rest as written.
    return parts.scheme, parts.hostname, port, quote(target, safe=_URL_ASCII)


def _resolve(resolver: Resolver, host: str, port: int, seconds: float) -> list[str] | None:
    """``resolver(host, port)``, or None when it has not answered within ``seconds``: a DNS
    server that never answers would hold the caller for as long as the system resolver retries."""
    answer: list[list[str] | BaseException] = []

    def resolve() -> None:
        try:
            answer.append(list(resolver(host, port)))
        except BaseException as exc:  # handed to the caller, which raises it there
            answer.append(exc)

    worker = threading.Thread(target=resolve, name="crag-resolve", daemon=True)
    worker.start()
    worker.join(max(0.0, seconds))
    if not answer:
        return None
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def _pick_address(host: str, port: int, resolver: Resolver, allowed: AddressPolicy | None, seconds: float) -> str | None:
    """The checked address to connect to, or None when resolving ``host`` took ``seconds``."""
    try:
        literal = ipaddress.ip_address(host)
        addresses = [str(literal)]
    except ValueError:
        try:
            resolved = _resolve(resolver, host, port, seconds)
            if resolved is None:
                return None
            addresses = resolved
        except (OSError, UnicodeError) as exc:
            raise FetchError(f"cannot resolve {host}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not addresses:
        raise FetchError(f"cannot resolve {host}")
    if allowed is not None:
        for a in addresses:
            try:
                ip = ipaddress.ip_address(a.split("%", 1)[0])
            except ValueError as exc:
                raise FetchError(f"{host} resolved to an invalid address {a!r}") from exc
            if not allowed(ip):
                raise FetchError(f"refused to fetch {host}: it resolves to {ip}, which is not a public address")
    return addresses[0]


def http_get(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    auth_headers: Mapping[str, str] | None = None,
    timeout: float = 20.0,
    max_bytes: int = 1024 * 1024,
    max_redirects: int = 3,
    address_allowed: AddressPolicy | None = None,
    resolver: Resolver = system_resolver,
    truncate: bool = False,
) -> Response:
    """GET ``url`` (see the module docstring). Raises ``FetchError`` on any failure.

    A 2xx answer is returned; any other final status raises ``FetchError`` with ``status``.
    With ``truncate`` a body longer than ``max_bytes`` is cut there (``Response.truncated``),
    otherwise it is an error.
    """
    deadline = time.monotonic() + timeout
    _check_url(url)  # a URL that cannot be split is a FetchError before anything else reads it
    first_origin = _origin(url)
    current = url
    for hop in range(max_redirects + 1):
        scheme, host, port, target = _check_url(current)
        address = _pick_address(host, port, resolver, address_allowed, deadline - time.monotonic())
        remaining = deadline - time.monotonic()
        if address is None or remaining <= 0:
            raise FetchError(f"timed out after {timeout:g}s fetching {url}")
        watchdog = _Watchdog(remaining)
        if scheme == "https":
            conn: http.client.HTTPConnection = _PinnedHTTPSConnection(
                address, host, port, remaining, ssl.create_default_context(), watchdog
            )
        else:
            conn = _PinnedHTTPConnection(address, host, port, remaining, watchdog)
        send = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})}
        withheld = bool(auth_headers) and _origin(current) != first_origin
        if auth_headers and not withheld:
            send.update(auth_headers)
        try:
            try:
                conn.request("GET", target, headers=send)
            except (ValueError, UnicodeError) as exc:  # http.client refuses the header value
                if isinstance(exc, ssl.SSLError):  # a certificate that fails verification is a ValueError too
                    raise
                names = ", ".join(sorted(send))
                raise FetchError(
                    f"a request header ({names}) holds characters HTTP cannot carry; check the configured credentials"
                ) from exc
            resp = conn.getresponse()
            status = resp.status
            if status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                resp.close()
                if not location:
                    raise FetchError(f"{current} answered {status} without a Location", status)
                if hop == max_redirects:
                    raise FetchError(f"too many redirects (more than {max_redirects}) fetching {url}", status)
                try:
                    current = urljoin(current, location.strip())
                except ValueError as exc:
                    raise FetchError(f"{current} redirected to a location that is not a valid URL: "
                                     f"{location.strip()[:200]!r}", status) from exc
                continue
            content_type = resp.getheader("Content-Type", "") or ""
            coding = (resp.getheader("Content-Encoding", "") or "").strip().lower()
            if 200 <= status < 300 and coding not in ("", "identity"):  # never inflated: a gzip bomb stays a few bytes
                raise FetchError(f"{current} sent its body compressed ({coding[:40]}) although crag asked for it "
                                 "uncompressed (Accept-Encoding: identity); crag does not decompress fetched bodies")
            retry_after = None if 200 <= status < 300 else parse_retry_after(dict(resp.getheaders()))
            body = _read_limited(resp, max_bytes, deadline, timeout, url)
            if watchdog.fired:  # the body ended because the deadline shut the connection
                raise FetchError(f"timed out after {timeout:g}s fetching {url}")
        except FetchError:
            raise
        except Exception as exc:
            if watchdog.fired or isinstance(exc, TimeoutError):
                raise FetchError(f"timed out after {timeout:g}s fetching {url}") from exc
            if isinstance(exc, ssl.SSLError):
                reason = exc.reason or exc
                if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
                    reason = f"{reason}: {exc.verify_message}"  # what is wrong with the certificate
                raise FetchError(f"TLS error talking to {host}: {reason}") from exc
            if isinstance(exc, (OSError, http.client.HTTPException)):
                raise FetchError(f"cannot fetch {current}: {_failure(exc)}") from exc
            raise
        finally:
            watchdog.cancel()
            conn.close()
        truncated = len(body) > max_bytes
        if truncated and not truncate:
            raise FetchError(f"{current} is larger than {max_bytes // 1024} KiB")
        body = body[:max_bytes]
        if not 200 <= status < 300:
            origin = f"{scheme}://{urlsplit(current).netloc}" if withheld else None  # _check_url refused a user:password
            raise FetchError(f"{current} answered HTTP {status}", status, origin, retry_after)
        mime, _, params = content_type.partition(";")
        charset = None
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.lower() == "charset" and value:
                charset = value.strip().strip('"') or None
        if charset is not None:
            try:  # a charset that cannot decode any bytes with replacement (idna, punycode, a binary codec) is none
                b"text \xc3\xa9 \x80\xff".decode(charset, errors="replace")
            except (LookupError, UnicodeError, ValueError):
                charset = None
        return Response(current, status, mime.strip().lower(), charset, body, truncated)
    raise FetchError(f"too many redirects fetching {url}")  # pragma: no cover - loop returns or raises


def _failure(exc: OSError | http.client.HTTPException) -> str:
    """What went wrong, in words: never the server's own status line (its CR LF, its text)."""
    if isinstance(exc, http.client.BadStatusLine) and not isinstance(exc, OSError):  # RemoteDisconnected is both
        return "answered with something that is not HTTP"
    if isinstance(exc, http.client.IncompleteRead):
        return "the body it sent was cut short or malformed"
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())


def _read_limited(resp: http.client.HTTPResponse, max_bytes: int, deadline: float, timeout: float, url: str) -> bytes:
    chunks = []
    size = 0
    while size <= max_bytes:
        if time.monotonic() > deadline:
            raise FetchError(f"timed out after {timeout:g}s fetching {url}")
        data = resp.read(min(65536, max_bytes + 1 - size))
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


_BLOCK = frozenset(
    """address article aside blockquote br dd details dialog div dl dt fieldset figcaption figure
    footer form h1 h2 h3 h4 h5 h6 header hr li main nav ol p pre section summary table tbody
    td tfoot th thead tr ul""".split()
)
_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "iframe", "object", "head"})


class TextExtractor(HTMLParser):
    """HTML to the parts of its text. ``verbatim`` holds the indexes of the parts that are
    whole lines to keep as they are (a code block's), which ``html_to_text`` does not tidy."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.verbatim: list[int] = []
        self.title_parts: list[str] = []
        self._skip = 0
        self._in_title = False
        self._pre = 0
        self._closing = False

    # At close(), html.parser answers a tag, comment or declaration that never ends (-1) by
    # re-scanning the rest of the page from its next character: quadratic time for a page of
    # them (``<a b='>'`` repeated). As in a browser, such a construct runs to the end instead.
    def close(self) -> None:
        self._closing = True
        super().close()

    def _or_rest(self, k: int) -> int:
        return len(self.rawdata) if k < 0 and self._closing else k

    def parse_starttag(self, i: int) -> int:
        return self._or_rest(super().parse_starttag(i))

    def parse_endtag(self, i: int) -> int:
        return self._or_rest(super().parse_endtag(i))

    def parse_comment(self, i: int, report: bool = True) -> int:
        return self._or_rest(super().parse_comment(i, report))

    def parse_pi(self, i: int) -> int:
        return self._or_rest(super().parse_pi(i))

    def parse_html_declaration(self, i: int) -> int:
        return self._or_rest(super().parse_html_declaration(i))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIP:
            self._skip += 1
        elif tag in _BLOCK:
            self.parts.append("\n")
            if tag == "li":
                self.parts.append("- ")
            if tag == "pre":
                self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK:
            self.parts.append("\n")
            if tag == "pre":
                self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title_parts.append(data)
            return
        if self._skip:
            return
        if self._pre:
            self.parts.append(data)
            return
        words = " ".join(data.split())
        lead = " " if data[:1].isspace() else ""
        trail = " " if data[-1:].isspace() and words else ""
        self.parts.append(lead + words + trail)


def _unopened(html: str) -> str:
    """``html`` with every ``<`` after its last ``>`` written as ``&lt;`` (the same text once
    read). No tag can start there, but ``html.parser`` rescans the rest of the document for
    each of them, so a page of ``<a<a<a...`` took minutes (quadratic time); now that tail is
    read in one pass, as the characters it shows."""
    last = html.rfind(">")
    return html[: last + 1] + html[last + 1 :].replace("<", "&lt;")


def html_to_text(html: str, parser: TextExtractor | None = None) -> tuple[str, str]:
    """(title, text) of an HTML document: scripts and styles dropped, blocks on their own lines.
    ``parser`` reads a dialect (Confluence's storage format); its verbatim parts stay as they are."""
    parser = parser or TextExtractor()
    try:
        parser.feed(_unopened(html))
        parser.close()
    except Exception:  # html.parser is lenient; never let odd markup fail a fetch
        pass
    out: list[str] = []
    start = 0
    for at in (*sorted(set(parser.verbatim)), len(parser.parts)):
        lines = [re.sub(r"[ \t]{2,}", " ", line).strip() for line in "".join(parser.parts[start:at]).split("\n")]
        for line in lines:
            if line or (out and out[-1]):
                out.append(line)
        if at < len(parser.parts):  # on lines of its own, blank ones kept
            if out and out[-1]:
                out.append("")
            out += parser.parts[at].split("\n")
        start = at + 1
    title = " ".join("".join(parser.title_parts).split())
    return title, "\n".join(out).strip()
