"""Text crag shows a person: secrets redacted, control sequences stripped, names made safe.

Everything crag prints comes from somewhere it does not control: documents, file names, a
model's reply, a server's error body. Three pure functions stand between that text and a
person (all used at the edges: the error boundary and the CLI's printing):

* ``redact(text, secrets)`` replaces every *secret-shaped* secret crag was given (API keys,
  tokens, the password of a configured URL; ``secret_shaped`` says which) with ``***``: what
  crag shows of documents and of a model's answer, which are the user's data and are never
  rewritten by a word pattern, nor by a configured value that is an ordinary word
  (``OPENAI_API_KEY=ollama`` leaves "ollama serve" alone);
  ``redacted_prefix(text, secrets)`` does the same for text still streaming in, holding
  back the tail that more text could turn into a secret, and ``ShownStream`` prints
  streamed chunks that way, made safe for a terminal;
* ``redact_message(text, secrets)`` masks every configured secret, whatever its shape, and
  anything shaped like a credential (``scheme://user:password@``, ``Authorization: Bearer
  ...``): for crag's own messages and records (errors, the settings in the answer log) and
  what a server echoed back in an error;
* ``redact_credentials(text, secrets)`` is ``redact`` plus the credentials written in the
  text (a URL's password, a secret-shaped value after ``Bearer`` or ``token=``): for the
  user's text the answer log keeps;
* ``scrub_error(error, secrets)`` applies ``redact_message`` to an exception crag raises and
  to the exceptions chained behind it (a server's error body can echo the key);
* ``for_terminal(text)`` removes ANSI/OSC escape sequences and control characters other
  than newline and tab (NUL, carriage return, backspace, C1 controls, bidirectional
  overrides), so neither a document nor a model can move the cursor, retitle the window,
  hide text or forge lines; those that are whitespace (vertical tab, form feed, NEL, the line
  and paragraph separators) become a space, so the words they part are not glued together;
* ``display_name(name)`` is a file name as crag shows it in footers, reports, prompts and
  messages: a name with a newline, a control character or bytes that are not UTF-8 is written
  with backslash escapes (``a\\nb.md``, ``caf\\xe9.md``), so a name can never add a line
  (JSON fields and the library's records keep the name itself: JSON escapes it);

``json_text(obj)`` is ``json.dumps`` whose output holds no raw control character either;
``valid_text(text)`` replaces lone surrogates (bytes that were not UTF-8, as Python keeps
them from a command line or a JSON escape) with U+FFFD, so text can be sent as UTF-8.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = [
    "REDACTED",
    "ShownStream",
    "ascii_json",
    "blank",
    "credentials_in",
    "display_name",
    "for_terminal",
    "json_text",
    "one_line",
    "read_back_name",
    "redact",
    "redact_credentials",
    "redact_message",
    "redacted_prefix",
    "scrub_error",
    "secret_shaped",
    "short_value",
    "valid_text",
]

REDACTED = "***"
MIN_SECRET_CHARS = 4  # shorter "secrets" would redact ordinary words, even in messages

# When a configured value looks like a secret rather than a word, so that it is masked in a
# document's text too: each row is (what it is, the fewest characters, the test), applied to
# the value without surrounding whitespace. Placeholders users set for local servers ("ollama",
# "none", "EMPTY", "lm-studio", "sk-no-key-required") match no row: they are words.
SECRET_SHAPES: tuple[tuple[str, int, Callable[[str], bool]], ...] = (
    ("letters and digits", 8, lambda v: any(c.isalpha() for c in v) and any(c.isdigit() for c in v)),
    ("upper and lower case", 16, lambda v: any(c.isupper() for c in v) and any(c.islower() for c in v)),
    ("long", 24, lambda v: True),
)

# scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s/@:]*):[^\s/@]*@")
# Authorization header values and key=value credentials in a message
_AUTH_VALUE = re.compile(
    r"(?i)\b(bearer|basic|token)(\s+|=)[A-Za-z0-9._~+/=\-]{6,}"
    r"|\b(api[_-]?key|access[_-]?token|secret|key)(=)[A-Za-z0-9._~+/=\-]{4,}"  # "?api_key=..." in a URL
)
# a password given as a parameter, as libpq reads it in a URI's query or a keyword string
_PASSWORD_VALUE = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&#]+)")

# ESC sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), DCS/SOS/PM/APC strings,
# two-character escapes; and their 8-bit C1 forms (CSI U+009B, OSC U+009D, ...). A string
# sequence is one only with its terminator, within a line: an opener alone (U+009D is common
# in text decoded twice: "â€\x9d" for a closing quote) goes as a control character, and the
# text after it stays.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b\x9c\n]{0,4096}(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[PX^_][^\x1b\x9c\n]{0,4096}(?:\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c\n]{0,4096}(?:\x07|\x1b\\|\x9c)"
)
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Co", "Cn"})


def _unsafe(ch: str, keep: str = "\n\t") -> bool:
    if ch in keep:
        return False
    if " " <= ch <= "~":  # printable ASCII: the common case, decided without a table
        return False
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _terminal_unsafe(ch: str) -> bool:
    # Format characters that only join or shape text (ZWJ in emoji, soft hyphen) stay;
    # the ones that reorder it (bidirectional overrides and isolates) go.
    if ch in "\u200c\u200d\u00ad\ufeff":
        return ch == "\ufeff"
    return _unsafe(ch)


# Whitespace a terminal cannot show safely (vertical tab and form feed move the cursor; the
# ASCII separators, NEL and the line and paragraph separators are line breaks few terminals
# draw) parts words as a space does. Removed, "orange\u2028and" read "orangeand". A carriage
# return is removed: it ends a line with the newline after it ("\r\n").
_SPACING = frozenset("\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029")


# What opens a string escape sequence (OSC: a window title, a hyperlink; DCS, SOS, PM, APC),
# in its 7-bit form (ESC and a letter) and its 8-bit one.
_STRING_OPENERS = ("\x1b]", "\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x9d", "\x90", "\x98", "\x9e", "\x9f")


def open_escape(text: str) -> int:
    """Where a string escape sequence still arriving at the end of ``text`` starts, or -1: until
    its terminator comes, ``for_terminal`` removes only its opener and shows its payload
    ("0;my window title"), which the terminator then removes whole. A lone ESC at the end (an
    escape, or the first half of a terminator) is held too."""
    end = len(text) - 1 if text.endswith("\x1b") else len(text)
    start = max(text.rfind(opener, 0, end) for opener in _STRING_OPENERS)
    if start == -1 or end - start > 4096 or any(t in text[start + 1 : end] for t in ("\x07", "\x9c", "\x1b\\", "\n")):
        return -1 if end == len(text) else end
    return start


def for_terminal(text: str) -> str:
    """``text`` with escape sequences and control characters (except newline, tab) removed;
    those that are whitespace (``_SPACING``) become a space, so the words they part stay apart.

    Bytes that were not valid text (lone surrogates) become U+FFFD.
    """
    # Nothing to remove (the common case, decided in C): every character printable, newlines and
    # tabs aside. What ``_terminal_unsafe`` removes is never printable (an escape starts with one).
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text
    text = _ESCAPES.sub("", text)
    return "".join(part if i % 2 else "".join(_shown(ch) if _terminal_unsafe(ch) else ch for ch in part)
                   for i, part in enumerate(_FLAG_TAGS.split(text)))


# A flag of a country's part (England, Scotland, Wales): a black flag, the tag characters that
# name the part ("gbsct") and a cancel tag. Format characters that only shape the emoji, kept
# whole as ZWJ is; other tag characters (text a screen never shows) go.
_FLAG_TAGS = re.compile("(\U0001f3f4[\U000e0030-\U000e0039\U000e0061-\U000e007a]{1,7}\U000e007f)")


def _shown(ch: str) -> str:
    """What a character ``for_terminal`` does not print is shown as."""
    if ch in _SPACING:
        return " "
    return "\ufffd" if unicodedata.category(ch) == "Cs" else ""


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it
        return f"\\x{code - 0xDC00:02x}"
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def display_name(name: str) -> str:
    """A file name or path as crag shows it: unchanged when it is plain text, else escaped.

    Newlines, tabs, control and format characters, and bytes that are not UTF-8 (kept by
    Python as lone surrogates) become backslash escapes; in such a name a backslash is
    doubled, so the escaped form reads back unambiguously.
    """
    if name.isascii() and name.isprintable():
        return name
    if not any(_unsafe(ch, "") for ch in name):
        return name
    return "".join("\\\\" if ch == "\\" else (_escape(ch) if _unsafe(ch, "") else ch) for ch in name)


_NAME_ESCAPE = re.compile(r"\\(\\|n|r|t|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")
_NAME_UNESCAPE = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}


def read_back_name(shown: str) -> str | None:
    """The name ``display_name`` showed as ``shown``, or None when ``shown`` holds no escape
    (or a backslash that is not one). ``\\xNN`` reads back as the character U+00NN: a name
    whose bytes are not UTF-8 is never indexed nor read, so it is never asked for back."""
    if "\\" not in shown or _NAME_ESCAPE.sub("", shown).count("\\"):
        return None

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        return _NAME_UNESCAPE.get(code) or chr(int(code[1:], 16))

    return _NAME_ESCAPE.sub(one, shown)


def short_value(value: object, limit: int = 60) -> str:
    """A value for an error message: escaped like a name and cut to ``limit`` characters."""
    text = display_name(str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str) -> str:
    """Whitespace runs (newlines included) collapsed to one space."""
    return " ".join(text.split())


def secret_shaped(value: str) -> bool:
    """Whether a configured value looks like a secret, not a word (a row of ``SECRET_SHAPES``)."""
    value = value.strip()
    return any(len(value) >= fewest and test(value) for _, fewest, test in SECRET_SHAPES)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each secret-shaped one of ``secrets`` replaced by ``***``, and nothing else
    changed.

    For documents and a model's prose: a word that only looks like a credential ("CPU Basic
    hardware", "## Token Policy") is the user's text, and so is a secret a document holds,
    and so is a word that happens to be configured as a key (``OPENAI_API_KEY=ollama``).
    """
    return _replace(text, _secret_set(secrets, shaped=True))


def redact_message(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every one of ``secrets`` (of at least ``MIN_SECRET_CHARS``), whatever its
    shape, and every credential-shaped part (a URL's password, ``password=...``, the value of
    an ``Authorization`` header, ``token=...``, ``api_key=...``, a secret-shaped value assigned
    to a name such as ``JIRA_API_TOKEN``, an AWS key id, a private key's body) replaced by
    ``***``: for crag's own messages and records and for server error bodies."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", _replace(text, _secret_set(secrets), fragments=True))
    text = _PASSWORD_VALUE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = _AUTH_VALUE.sub(lambda m: f"{m.group(1) or m.group(3)}{m.group(2) or m.group(4)}{REDACTED}", text)
    for pattern, group, any_value in _CREDENTIALS[2:]:  # a value after a name holding "token"; AWS; private keys
        text = pattern.sub(lambda m, g=group, a=any_value: _masked(m, g, a), text)
    return text


# Credentials written in text, each (pattern, the group of the value, whether any value is one):
# a URL's password; an Authorization value or a key=value credential; a value assigned to a
# name that holds such a word (``JIRA_API_TOKEN=``, ``aws_secret_access_key =``, ``"client_secret":``);
# an AWS access key id; a token whose shape names its issuer; the body of a private key block
# (its base64 lines). ``redact_message`` applies every row from the third on too (it has
# broader rules of its own for the first two).
_CREDENTIALS: tuple[tuple[re.Pattern[str], int, bool], ...] = (
    (re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s/@:]*:([^\s/@]*)@"), 1, True),
    (re.compile(r"(?i)\b(bearer|basic|token|api[_-]?key|password|secret)(\s*[=:]\s*|\s+(?:is\s+|was\s+)?)"
                r"([A-Za-z0-9._~+/=\-]{8,})"), 3, False),
    (re.compile(r"(?i)(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|private[_-]?key)(?:[_.\-][A-Za-z0-9_.\-]{0,40})?"
                r"[\"']?[ \t]*[=:][ \t]*[\"']?([A-Za-z0-9._~+/=\-]{8,})"), 1, False),
    (re.compile(r"\b((?:AKIA|ASIA)[0-9A-Z]{16})\b"), 1, True),
    # tokens whose shape says what they are, wherever they stand: GitHub, Hugging Face, OpenAI
    # and Anthropic style, GitLab, npm, Stripe, Slack, Google API keys, JSON web tokens; one that
    # holds no digit nor capital letter is words (glpat-style-names, hf_hub_download_to_local_dir)
    (re.compile(r"(?<![\w-])(?=[\w-]*?[0-9A-Z])((?:gh[pousr]_|github_pat_|hf_)[A-Za-z0-9_]{30,}|sk-[A-Za-z0-9_\-]{20,}"
                r"|gl(?:pat|ptt|dt|rtr?|cbt|ft|imt|oas|soat|agent)-[A-Za-z0-9_\-]{20,}|npm_[A-Za-z0-9]{36}|[sr]k_(?:live|test)_[A-Za-z0-9]{20,}"
                r"|xox[abposr]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35}"
                r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})(?![\w-])"), 1, True),
    (re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----(?:\s*(?:Proc-Type|DEK-Info):[^\n]*)*((?:\s*[A-Za-z0-9+/=]{4,})+)"),
     1, True),
)

# A password a person chose holds any printable characters ("Tr0ub4dor&3", "P@ssw0rd!2024"), not
# only a token's: after "password" or "secret", or assigned to a name holding such a word, the
# value runs to the next space or quote, less a sentence's closing punctuation. Matched before
# the rows above, which stop at the first "&" or "!" and showed the rest; before a closing quote
# that punctuation is the value's own ("`P@ss(w0rd)!`" left ")!" shown), its symbol when it has no
# other ("`Summer2024!`" was kept whole). Only a value with a
# symbol inside it, as a chosen password has (a word's hyphen or dot, a path's slashes and a
# citation's colon are none; "#general" leads with one), that is no URL, e-mail address, call
# or subscript (``hash_v2(pw, salt)``, ``os.environ[``) nor placeholder (``${DB_PASS}``,
# ``<your-secret>``): those are left to the rows above, as they were before this rule.
_PASSWORD_CHARS = (r"(?=[^\s\"'`]+[^\w\s\"'`.\-/\\:][^\s\"'`]*[^\s\"'`.,;:!?)\]}>]"
                   r"|[^\s\"'`]*[^\s\"'`.,;:!?)\]}>][.,;:]*[!?)\]}>][.,;:!?)\]}>]*[\"'`])"
                   r"(?![a-z][a-z0-9+.\-]*://|[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)*\.[a-z]{2,}(?:[.,;:!?)\]}>]*(?:[\s\"'`]|$))"
                   r"|[\w.\-]+[(\[]|\$[{(]|\{\{|%\(|<[\w\-]+>)"
                   r"([^\s\"'`]{7,}(?:[^\s\"'`.,;:!?)\]}>]|[.,;:!?)\]}>]+(?=[\"'`])))")
_PASSWORDS: tuple[tuple[re.Pattern[str], int, bool], ...] = (
    (re.compile(r"(?i)\b(password|passwd|passphrase|secret)(\s*=\s*)" + _PASSWORD_CHARS), 3, False),
    # in prose too ("the secret is Base64-encoded", "Secret: ConfigMap2024 objects" are words),
    # in quotes or as code: "my password `P@ssw0rd!2024` is refused"
    (re.compile(r"(?i)\b(password|passwd|passphrase|secret)(\s*:\s*|\s+(?:is\s+|was\s+)?)[\"'`]?" + _PASSWORD_CHARS),
     3, False),
    (re.compile(r"(?i)(?:secret|passw(?:or)?d|passphrase)(?:[_.\-][A-Za-z0-9_.\-]{0,40})?[\"']?[ \t]*[=:][ \t]*[\"']?"
                + _PASSWORD_CHARS), 1, False),
)


def credentials_in(text: str) -> tuple[str, ...]:
    """The credentials written in ``text`` (``_CREDENTIALS``; a value after a word such as
    ``token`` only when it is secret-shaped): those of a question are masked wherever its answer
    repeats them, ``Bearer`` or no."""
    found = []
    for pattern, group, any_value in (*_PASSWORDS, *_CREDENTIALS):
        for match in pattern.finditer(text):
            value = match.group(group)
            if any_value or secret_shaped(value):  # a private key's body: each of its lines
                found += [part for part in value.split() if len(part) >= MIN_SECRET_CHARS]
    return tuple(found)


def redact_credentials(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` as ``redact`` gives it, with the credentials written in it masked too
    (``credentials_in``): a URL's password, an AWS key id, a private key's body, and a
    secret-shaped value after ``Bearer``, ``Basic``, ``token``, ``api_key``, ``password`` or
    ``secret`` ("my password is ...") or assigned to a name holding such a word
    (``JIRA_API_TOKEN=...``), so "the token expires" is left alone, and a token whose shape
    names its issuer (``ghp_...``, ``hf_...``, ``sk-...``, ``xoxb-...``, a JSON web token). For what the answer log keeps of the user's text: a credential pasted
    into a question is not written to disk."""
    text = redact(text, secrets)
    for pattern, group, any_value in (*_PASSWORDS, *_CREDENTIALS):
        text = pattern.sub(lambda m, g=group, a=any_value: _masked(m, g, a), text)
    return text


def _masked(match: re.Match[str], group: int, any_value: bool) -> str:
    value = match.group(group)
    if not value.strip() or not (any_value or secret_shaped(value)):  # a URL's password however short
        return match.group(0)
    start, end = match.start(group) - match.start(), match.end(group) - match.start()
    lead, trail = value[: len(value) - len(value.lstrip())], value[len(value.rstrip()) :]
    return match.group(0)[:start] + lead + REDACTED + trail + match.group(0)[end:]


# In crag's own messages (what a server echoes in an error), a run of FRAGMENT_CHARS
# characters of a secret of at least FRAGMENT_OF is a part of it (a server that echoes the key
# without its "sk-proj-" or keeps only its last 40 characters): masked as the whole is. Not in
# documents or answers, whose text is the user's (a placeholder key of x's, a PEM's armour).
FRAGMENT_CHARS = 16
FRAGMENT_OF = 24


def _replace(text: str, secrets: set[str], fragments: bool = False) -> str:
    ordered = sorted(secrets, key=len, reverse=True)
    for secret in ordered:
        text = text.replace(secret, REDACTED)
    for secret in ordered if fragments else ():  # after every whole one: a part of one secret can hold
        if _fragmentable(secret):                 # another whole (a Basic value in its %-escaped form)
            text = _without_fragments(text, secret)
    return text


def _fragmentable(secret: str) -> bool:
    """Whether a run of ``FRAGMENT_CHARS`` characters of ``secret`` can only be a part of it: a
    long value of varied characters, not a placeholder (``sk-xxxx...``) or a PEM's armour."""
    return (len(secret) >= FRAGMENT_OF and len(set(secret)) >= FRAGMENT_CHARS // 2
            and "-----" not in secret)


def _without_fragments(text: str, secret: str) -> str:
    """``text`` with every run of at least ``FRAGMENT_CHARS`` characters of ``secret`` masked."""
    for i in range(len(secret) - FRAGMENT_CHARS + 1):
        window = secret[i : i + FRAGMENT_CHARS]
        at = text.find(window)
        while at != -1:
            start, end, j = at, at + FRAGMENT_CHARS, i + FRAGMENT_CHARS
            while end < len(text) and j < len(secret) and text[end] == secret[j]:
                end, j = end + 1, j + 1
            k = i
            while start > 0 and k > 0 and text[start - 1] == secret[k - 1]:
                start, k = start - 1, k - 1
            text = text[:start] + REDACTED + text[end:]
            at = text.find(window, start + len(REDACTED))
    return text


E = TypeVar("E", bound=BaseException)


def scrub_error(error: E, secrets: Iterable[str] = ()) -> E:
    """``error`` with its message and those of the exceptions chained behind it (``__cause__``,
    ``__context__``) passed through ``redact_message``, in place, and returned.

    crag chains the SDK's exception behind its own (``raise ... from exc``) for bug reports;
    that exception's message holds what the server sent, and a server may echo the key. A
    service that logs the error (``logging.exception``) prints the whole chain, so each link
    is masked like crag's own message. A link whose text cannot be rewritten (a ``__str__``
    of its own) is cut from the chain instead."""
    seen: set[int] = set()
    link: BaseException | None = error
    previous: BaseException | None = None
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        shown = str(link)
        clean = redact_message(shown, secrets)
        if clean != shown:
            link.args = (clean,)
            if isinstance(getattr(link, "message", None), str):
                link.message = redact_message(link.message, secrets)  # type: ignore[attr-defined]
            if str(link) != clean and previous is not None:
                previous.__cause__ = previous.__context__ = None
                previous.__suppress_context__ = True
                break
        previous, link = link, link.__cause__ or link.__context__
    return error


_SURROGATE = re.compile("[\ud800-\udfff]")


def blank(text: str) -> bool:
    """Whether ``text`` holds nothing a person could read: only whitespace, control and format
    characters (zero-width spaces, bidirectional marks) and escape sequences. A question or a
    query of such text is empty, however many characters it has."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in _ESCAPES.sub("", text))


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD: encodable as UTF-8."""
    return _SURROGATE.sub("\ufffd", text)


def _secret_set(secrets: Iterable[str], *, shaped: bool = False) -> set[str]:
    out: set[str] = set()
    for secret in secrets:
        if secret and len(secret.strip()) >= MIN_SECRET_CHARS and (not shaped or secret_shaped(secret)):
            out.update((secret, secret.strip()))
    return out


def redacted_prefix(text: str, secrets: Iterable[str] = (), whole_words: bool = True) -> str:
    """The part of a text still arriving (a streamed answer) that can be shown now, redacted.

    ``redact`` of the whole text, once it is complete, starts with what this returns: the
    text is cut before its last word (it may still be growing), before a secret that the cut
    would split, and before an unfinished secret at its end. Without ``whole_words`` (a
    preview redrawn whole each time) the last word stays, unless it is the beginning of a secret.
    """
    cut = len(text)
    while whole_words and cut and not text[cut - 1].isspace():
        cut -= 1
    for secret in _secret_set(secrets, shaped=True):
        for k in range(len(secret) - 1, 0, -1):  # the text ends with the beginning of a secret
            if text.endswith(secret[:k]):
                cut = min(cut, len(text) - k)
                break
        start = text.find(secret)
        while start != -1 and start < cut:  # a secret the cut would split
            if start + len(secret) > cut:
                cut = start
                break
            start = text.find(secret, start + 1)
    return redact(text[:cut], secrets)


class ShownStream:
    """Streamed text as a terminal shows it: ``feed(chunk)`` returns what can be shown now of
    all the chunks so far, terminal-safe and redacted (``redacted_prefix``), beyond what it
    showed before; ``rest(final)`` what ``final`` (the whole text, shown as ``redact`` and
    ``for_terminal`` show it) adds after that, or, when it does not extend what was shown, a
    blank line and all of it.

    With ``whole_words`` off, for chunks that nothing later changes (``Agent.stream``'s grounded
    sentences), a chunk's last word is shown with it: held back, a sentence showed without its
    citation marker until the next sentence was final, and kept it so when Ctrl-C stopped there."""

    def __init__(self, secrets: Iterable[str] = (), whole_words: bool = True) -> None:
        self.secrets = tuple(secrets)
        self.whole_words = whole_words
        self.text = ""
        self.shown = ""

    def feed(self, chunk: str) -> str:
        self.text += chunk
        now = redacted_prefix(for_terminal(self.text), self.secrets, whole_words=self.whole_words)
        if not now.startswith(self.shown):
            return ""
        new, self.shown = now[len(self.shown) :], now
        return new

    def rest(self, final: str) -> str:
        if final.startswith(self.shown):
            return final[len(self.shown) :]
        return ("\n\n" if self.shown else "") + final


def ascii_json(text: str) -> str:
    """JSON text (``json_text``'s) with every non-ASCII character written as ``\\uXXXX``:
    the same document, for a stream whose encoding cannot write them (an ASCII locale)."""
    return _NOT_ASCII.sub(_json_escape, text)


_NOT_ASCII = re.compile("[^\x00-\x7f]+")


def _json_escape(match: re.Match[str]) -> str:
    return "".join(f"\\u{unit:04x}" for unit in _utf16_units(match.group(0)))


def _utf16_units(text: str) -> list[int]:
    units: list[int] = []
    for ch in text:
        code = ord(ch)
        if code > 0xFFFF:
            code -= 0x10000
            units += [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]
        else:
            units.append(code)
    return units


_JSON_UNSAFE = re.compile(
    "[\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
    "\ud800-\udfff\U000e0000-\U000e007f]"
)


def json_text(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` with DEL, C1 controls, bidirectional
    and invisible format characters and lone surrogates written as ``\\uXXXX`` escapes.

    JSON escapes C0 controls itself; the rest can only occur inside strings, so escaping
    them keeps the document valid and equal when parsed.
    """
    return _JSON_UNSAFE.sub(_json_escape, json.dumps(obj, ensure_ascii=False, **kwargs))
