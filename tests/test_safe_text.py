"""``crag.safe_text``: what stands between untrusted text and a person."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from crag.safe_text import (
    display_name,
    for_terminal,
    json_text,
    redact,
    redact_message,
    redacted_prefix,
    secret_shaped,
    short_value,
)

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def test_for_terminal_removes_ansi_osc_and_nul_but_keeps_text_newlines_and_tabs() -> None:
    hostile = "red \x1b[31mALERT\x1b[0m\x00 title\x1b]0;pwned\x07 link \x1b]8;;http://x\x1b\\y\x1b]8;;\x1b\\\n\tnext\r\x08"
    assert for_terminal(hostile) == "red ALERT title link y\n\tnext"


def test_for_terminal_removes_c1_controls_and_bidi_overrides_and_replaces_undecodable_bytes() -> None:
    assert for_terminal("a\x9b31mb\u202ec\udce9") == "ab" + "c\ufffd"
    assert for_terminal("naïve 日本語 😀 emoji\u200djoin") == "naïve 日本語 😀 emoji\u200djoin"


def test_for_terminal_shows_whitespace_controls_as_a_space_not_gluing_the_words_they_part() -> None:
    """Vertical tab, form feed, NEL and the line and paragraph separators were removed like
    any control character, so "orange\u2028and" was shown (and quoted offline) as "orangeand"."""
    assert for_terminal("orange\u2028and\x85copper\x0bvertical\x0cform\u2029end\x1cx") == (
        "orange and copper vertical form end x")
    assert for_terminal("line\r\nnext\x00") == "line\nnext"  # a carriage return and NUL still go


def test_an_escape_string_opened_and_never_closed_takes_nothing_after_it() -> None:
    """A lone U+009D (text decoded twice: "â€\x9d" for a closing quote) was read as an
    operating-system command running to the end of the text: the rest of the answer, its
    sources and its usage block were not printed, exit status 0."""
    answer = "The phrase is â€œhelloâ€\x9d and more.\n\n[1] kb/quotes.md:L3\n\n---\n📊 **LLM Usage Stats:**"
    assert for_terminal(answer) == answer.replace("\x9d", "")
    for opener in ("\x1b]0;", "\x1bP", "\x90", "\x98", "\x9e", "\x9f"):
        assert for_terminal(f"a {opener}b\nnext line").endswith("b\nnext line")
    assert for_terminal("a \x9d0;title\x9c b") == "a  b"  # closed: still a sequence, removed whole


def test_display_name_escapes_newlines_controls_and_bytes_that_are_not_utf8() -> None:
    assert display_name("docs/setup.md") == "docs/setup.md"
    assert display_name("docs/日本語.md") == "docs/日本語.md"
    assert display_name("a\n[2] SECRETS.md:L1") == "a\\n[2] SECRETS.md:L1"
    assert display_name("caf\udce9.md") == "caf\\xe9.md"
    assert display_name("x\x1b[31m\\y") == "x\\x1b[31m\\\\y"


def test_short_value_escapes_and_cuts() -> None:
    assert short_value("a\x00b") == "a\\x00b"
    assert len(short_value("x" * 5000)) == 60


def test_a_message_has_known_secrets_url_passwords_and_authorization_values_redacted() -> None:
    text = ("Incorrect API key provided: sk-live-1234567890 at http://user:hunter22@host/v1 "
            "(header was Bearer abcdefghijkl)")
    out = redact_message(text, ["sk-live-1234567890"])
    assert "sk-live-1234567890" not in out and "hunter22" not in out and "abcdefghijkl" not in out
    assert "http://user:***@host/v1" in out
    assert redact_message("no secrets here", ["abc"]) == "no secrets here"  # too short to redact safely


def test_a_token_written_as_a_urls_user_name_is_a_secret_and_a_short_name_is_not() -> None:
    """``https://TOKEN@host`` is a common way to write a token; without a password, a user name
    of 8 characters or more is masked as a password is (with the Basic value it is sent as)."""
    import base64

    from crag.environment import find_secrets

    found = find_secrets({"OPENAI_BASE_URL": "http://sk-tokenonly@127.0.0.1:8080/v1"})
    assert "sk-tokenonly" in found and base64.b64encode(b"sk-tokenonly:").decode() in found
    assert redact_message("LLM server http://sk-tokenonly@127.0.0.1:8080/v1 answered 401", found) == (
        "LLM server http://***@127.0.0.1:8080/v1 answered 401")
    assert find_secrets({"OPENAI_BASE_URL": "http://bob@127.0.0.1:8080/v1"}) == ()
    # another tool's URL names a user: postgres stays a word in crag's messages
    assert find_secrets({"DATABASE_URL": "postgresql://postgres@localhost/app"}) == ()
    assert "bob-the-admin" not in find_secrets({"OPENAI_BASE_URL": "http://bob-the-admin:pw-12345@host/v1"})


def test_a_message_has_password_parameters_redacted_but_not_the_word_password() -> None:
    # libpq reads a password from a URI's query and from a keyword string, too
    assert redact_message("postgresql:///kb?host=/run/pg&password=hunter22&sslmode=require") == (
        "postgresql:///kb?host=/run/pg&password=***&sslmode=require")
    assert redact_message("host=db user=crag password = 'hunter 22' dbname=kb") == "host=db user=crag password = *** dbname=kb"
    line = 'FATAL: password authentication failed for user "crag"'
    assert redact_message(line) == line


AUTH_WORD_LINES = [
    "| CPU Basic hardware | 2 vCPU |",
    "## Token Policy",
    "If the token contains `foobar`, refresh it.",
    "Use bearer tokens: `Authorization: Bearer abcdefghijkl`.",
    "connect with postgresql://deployer:Hunter2Pw@db.internal/kb",
    "token=zzzzzz9 is the example value",
]


def test_document_text_is_redacted_only_where_it_holds_a_configured_secret() -> None:
    for line in AUTH_WORD_LINES:
        assert redact(line, ["sk-live-1234567890"]) == line  # a document's words are its own
    assert redact("the key sk-live-1234567890 leaked", ["sk-live-1234567890"]) == "the key *** leaked"
    assert redact("pw Hunter2Pw", [" Hunter2Pw "]) == "pw ***"  # a value set with spaces around it


@given(st.text(), st.lists(st.text(min_size=4), max_size=3))
def test_redact_changes_nothing_but_the_secret_shaped_secrets(text: str, secrets: list[str]) -> None:
    shown = redact(text, secrets)
    if not any(s.strip() and s.strip() in text for s in secrets if secret_shaped(s)):
        assert shown == text
    for secret in secrets:
        if secret_shaped(secret) and "*" not in secret:
            assert secret.strip() not in shown


@given(st.text(), st.lists(st.text(min_size=4), max_size=3))
def test_a_message_never_holds_a_configured_secret_whatever_its_shape(text: str, secrets: list[str]) -> None:
    shown = redact_message(text, secrets)
    for secret in secrets:
        if len(secret.strip()) >= 4 and "*" not in secret and not any(c in secret for c in ":@/="):
            assert secret.strip() not in shown


KEY = "sk-proj-XuomWibaEOX8kq2Lr5Tz9Yb1Nc4Vd7Mf0Gh3Jp6Ws8Qa2ZoiWvS6"


def test_a_part_of_a_long_key_is_masked_in_crags_messages_as_the_whole_key_is() -> None:
    # A server echoed the key without its "sk-proj-" ("Incorrect API key provided: Xuom...")
    # or kept only its last 40 characters, and the error line showed them.
    body = KEY.removeprefix("sk-proj-")
    assert redact_message(f"Incorrect API key provided: {body}.", [KEY]) == "Incorrect API key provided: ***."
    assert redact_message(f"key ...{KEY[-40:]} refused", [KEY]) == "key ...*** refused"
    assert redact_message(f"short {KEY[10:25]} part", [KEY]) == f"short {KEY[10:25]} part"  # 15 characters


def test_a_documents_text_is_not_masked_for_sharing_a_part_with_a_configured_value() -> None:
    # A placeholder key of x's masked a document's row of x's, and a configured PEM key the
    # "-----BEGIN PRIVATE KEY-----" line a document quotes: documents are the user's text.
    placeholder = "sk-" + "x" * 32
    assert redact("a row of " + "x" * 32, [placeholder]) == "a row of " + "x" * 32
    assert redact_message("a row of " + "x" * 32, [placeholder]) == "a row of " + "x" * 32
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    line = "It must start with the line -----BEGIN PRIVATE KEY----- and end with -----END PRIVATE KEY-----."
    assert redact(line, [pem]) == line and redact_message(line, [pem]) == line
    assert redact(f"Debug {KEY[:-1]} now", [KEY]) == f"Debug {KEY[:-1]} now"  # an answer's text: the whole only


PLACEHOLDER_KEYS = ["ollama", "none", "EMPTY", "lm-studio", "not-needed", "sk-no-key-required", "dummy", "password"]
REAL_KEYS = ["sk-proj-Ab3dEf6hIj9kLm", "ghp_0123456789abcdefABCDEF0123456789abcd", "abcdef123456", "Hunter2Pw",
             "3f9a0c1e5b7d2a4c6e8f0a1b", "CorrectHorseBatteryStaple", "correcthorsebatterystapleplus"]


def test_a_configured_word_is_not_masked_in_documents_but_always_in_messages() -> None:
    for key in PLACEHOLDER_KEYS:
        assert not secret_shaped(key), key
        doc = f"Start {key} with `{key} serve`; {key} are employed."
        assert redact(doc, [key]) == doc  # the user's document, as written
        assert redacted_prefix(doc + " more", [key]) == doc + " "  # a streamed answer too
        assert key not in redact_message(f"crag: error: the server refused key {key}", [key])
    for key in REAL_KEYS:
        assert secret_shaped(key), key
        assert redact(f"the key {key} leaked", [key]) == "the key *** leaked"
    assert secret_shaped(" jira tok 42 ")  # a token may hold a space


def test_json_text_escapes_every_control_character_and_reads_back_equal() -> None:
    value = {"path": "a\nb\x1b[31m\x9b\u202e\udce9.md", "text": "日本語"}
    out = json_text(value)
    assert not CONTROL.search(out)
    assert "日本語" in out
    assert json.loads(out) == value


@given(st.text())
def test_terminal_text_never_holds_a_control_character(text: str) -> None:
    assert not CONTROL.search(for_terminal(text).replace("\n", "").replace("\t", ""))


@given(st.text())
def test_display_names_are_one_line_and_control_free(name: str) -> None:
    shown = display_name(name)
    assert "\n" not in shown and not CONTROL.search(shown)


@given(st.recursive(st.text() | st.integers() | st.none(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_json_text_round_trips_and_is_control_free(value: object) -> None:
    out = json_text(value)
    assert not CONTROL.search(out)
    assert json.loads(out) == value


def test_valid_text_replaces_lone_surrogates_only() -> None:
    from crag.safe_text import valid_text

    assert valid_text("caf\udce9 \U0001F4CA ok") == "caf\ufffd \U0001F4CA ok"
    assert valid_text("plain") == "plain"
    valid_text("\ud800\udfff x").encode("utf-8")  # encodable


def test_a_key_in_a_url_query_is_masked_in_crags_messages() -> None:
    # OPENAI_BASE_URL='http://127.0.0.1:9/v1?api_key=hunter2pw': the error line printed the key.
    line = redact_message("cannot reach http://127.0.0.1:9/v1?api_key=hunter2pw&access_token=abcd1234 (refused)")
    assert "hunter2pw" not in line and "abcd1234" not in line and "api_key=***&access_token=***" in line
