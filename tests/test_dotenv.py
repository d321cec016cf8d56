"""``.env`` lines as a user writes them (SPEC §3): quotes, escapes, comments, ``export``."""

from __future__ import annotations

import pytest

from crag.config import Settings, config_warnings
from crag.environment import read_dotenv, secret_values
from crag.errors import ConfigError


@pytest.mark.parametrize(("line", "value"), [
    ('KB_AGENT_MODEL="my\\"model"', 'my"model'),  # an escaped double quote inside double quotes
    ('KB_AGENT_MODEL="a\\\\b"', "a\\b"),  # an escaped backslash
    ('KB_AGENT_MODEL="my\\"model"  # the team model', 'my"model'),
    ('KB_AGENT_INDEX_DIR="C:\\new\\kb"', "C:\\new\\kb"),  # other backslashes stay as written
    ("KB_AGENT_MODEL='a\\\"b'", 'a\\"b'),  # single quotes take everything literally
    ("KB_AGENT_TOP_K=7\t# seven", "7"),  # a comment after a tab
    ("KB_AGENT_TOP_K=7 # seven", "7"),
    ("KB_AGENT_MODEL=a#b", "a#b"),  # a # inside a word is the value's
    ("KB_AGENT_MODEL= # pick one later", ""),  # nothing but a comment: set to nothing (was "# pick one later")
    ("KB_AGENT_TOP_K=\t# the default", ""),
    ("KB_AGENT_MODEL=#1", "#1"),
])
def test_a_value_reads_as_a_shell_would_read_it(tmp_path, line, value):
    """``KEY="a\\"b"`` kept the backslash, and ``KEY=7<TAB># seven`` kept the comment in the
    value (KB_AGENT_TOP_K=7\\t# seven was then refused as not an integer)."""
    var = line.partition("=")[0]
    f = tmp_path / ".env"
    f.write_text(line + "\n", encoding="utf-8")
    assert read_dotenv(f) == {var: value}


def test_export_followed_by_a_tab_is_an_export(tmp_path):
    """``export<TAB>KB_AGENT_TOP_K=7`` was read as a variable named "export\\tKB_AGENT_TOP_K",
    silently: the setting kept its default with no warning."""
    f = tmp_path / ".env"
    f.write_text("export\tKB_AGENT_TOP_K=7\n", encoding="utf-8")
    assert read_dotenv(f) == {"KB_AGENT_TOP_K": "7"}
    assert Settings.from_env(environ={}, dotenv=f).top_k == 7


@pytest.mark.parametrize("text", [
    'KB_AGENT_MODEL="llama3\n',  # the closing quote forgotten
    'KB_AGENT_MODEL="llama3" and more\n',  # words after the closing quote
    "KB_AGENT_MODEL='llama3\n",
])
def test_a_quote_left_open_or_followed_by_words_is_not_an_assignment(tmp_path, text):
    """``KB_AGENT_MODEL="llama3`` sent the model name with its quote to the server: such a
    line is warned about, with its number, like any line that is not an assignment."""
    f = tmp_path / ".env"
    f.write_text("KB_AGENT_TOP_K=7\n" + text, encoding="utf-8")
    assert read_dotenv(f) == {"KB_AGENT_TOP_K": "7"}
    warnings = config_warnings(environ={}, dotenv=f)
    assert any("line 2 is not an assignment" in w for w in warnings), warnings


@pytest.mark.parametrize(("line", "hint"), [
    ("KB_AGENT_TOP_K 7", "; did you mean KB_AGENT_TOP_K=...?"),  # the = forgotten
    ("KB_AGENT_TOP_K: 7", "; did you mean KB_AGENT_TOP_K=...?"),  # YAML's colon
    ("export KB_AGENT_MAX_ITERATION 2", "; did you mean KB_AGENT_MAX_ITERATIONS=...?"),
    ('KB_AGENT_MODEL="llama3', "; did you mean KB_AGENT_MODEL=...?"),  # a quote left open
    ("set KB_AGENT_TOP_K=7", "; did you mean KB_AGENT_TOP_K=...?"),  # cmd.exe's set: was read as the name "set KB_AGENT_TOP_K"
    ("EXPORT KB_AGENT_TOP_K=7", "; did you mean KB_AGENT_TOP_K=...?"),  # and was ignored without a word
    ("KB AGENT TOP K=7", ""),
    ("sk-live-abcdef123456", ""),  # a pasted key: not a name, and never shown
    ("hello world", ""),
])
def test_a_line_that_is_not_an_assignment_is_warned_about_with_the_closest_setting(tmp_path, line, hint):
    """SPEC §3: ".env lines that are not assignments are warned about, with the closest known
    name"; the warning gave the line's number alone. It never shows the line's text."""
    f = tmp_path / ".env"
    f.write_text(line + "\n", encoding="utf-8")
    assert config_warnings(environ={}, dotenv=f) == [f"{f} line 1 is not an assignment (NAME=value); it is ignored{hint}"]


def test_the_env_read_last_stays_parsed_when_another_fills_the_memory(tmp_path, monkeypatch):
    """The memory of parsed ``.env`` files was emptied whole when full: with seven kept from
    other folders, reading this folder's then another's parsed this one again at every line
    printed (``crag log`` asks for the secrets once a line)."""
    import os

    import crag.environment as environment

    monkeypatch.setattr(environment, "_RACY_NS", 0)
    monkeypatch.setattr(environment, "_DOTENV_READS", {})
    files = []
    for i in range(environment._DOTENV_READS_KEPT + 1):
        (tmp_path / str(i)).mkdir()
        files.append(tmp_path / str(i) / ".env")
        files[-1].write_text(f"KB_AGENT_MODEL=m{i}\n", encoding="utf-8")
        os.utime(files[-1], (1_600_000_000, 1_600_000_000))
    for f in files[:-2]:
        read_dotenv(f)
    parsed = []
    real_parse = environment._parse_dotenv
    monkeypatch.setattr(environment, "_parse_dotenv", lambda path, bad: parsed.append(path) or real_parse(path, bad))
    for _ in range(3):
        assert read_dotenv(files[-2]) == {"KB_AGENT_MODEL": f"m{len(files) - 2}"}
        assert read_dotenv(files[-1]) == {"KB_AGENT_MODEL": f"m{len(files) - 1}"}
    assert parsed == [files[-2], files[-1]]


@pytest.mark.parametrize(("name", "meant"), [
    ("KB_AGENT_JIRA_BASE_URL", "JIRA_BASE_URL"), ("KB_AGENT_OPENAI_API_KEY", "OPENAI_API_KEY"),
    ("KB_AGENT_TOPK", "KB_AGENT_TOP_K"),
])
def test_a_setting_named_with_the_prefix_it_has_not_is_pointed_at_its_name(name, meant):
    """KB_AGENT_JIRA_BASE_URL was "did you mean KB_AGENT_EMBEDDING_BASE_URL?", and Jira stayed off."""
    [warning] = config_warnings(environ={name: "x"}, dotenv=None)
    assert warning.endswith(f"did you mean {meant}?"), warning


@pytest.mark.parametrize(("name", "hint"), [
    ("KB_AGENT_TEMP", "; did you mean KB_AGENT_TEMPERATURE?"),  # was KB_AGENT_TOP_K
    ("KB_AGENT_API_KEY", "; did you mean OPENAI_API_KEY?"),  # was KB_AGENT_TOP_K
    ("KB_AGENT_TIMEOUT", "; did you mean KB_AGENT_LLM_TIMEOUT?"),
    ("KB_AGENT_DEBUG", ""),  # was KB_AGENT_MODEL
    ("KB_AGENT_FOO", ""),  # was KB_AGENT_LOG
    ("KB_AGENT_PORT", ""),  # was KB_AGENT_STORE
    ("KB_AGENT_BASE_URL", ""),  # the last words of four settings': was JIRA_BASE_URL
    ("KB_AGENT_API_TOKEN", ""),  # Jira's or Confluence's: was JIRA_API_TOKEN
])
def test_an_unknown_name_is_compared_without_the_prefix_every_setting_shares(name, hint):
    """The KB_AGENT_ prefix made every name close to every setting, so a name that means none
    was pointed at an unrelated one (KB_AGENT_DEBUG: "did you mean KB_AGENT_MODEL?") and a short
    one at the wrong one (KB_AGENT_TEMP: "did you mean KB_AGENT_TOP_K?")."""
    assert config_warnings(environ={name: "1"}, dotenv=None) == [
        f"{name} (in the environment) is not a crag setting{hint}"]


def test_a_line_naming_no_setting_gets_no_unrelated_hint(tmp_path):
    """``KB_AGENT_FOO 1`` was "did you mean KB_AGENT_LOG=...?": the shared prefix alone was close."""
    f = tmp_path / ".env"
    f.write_text("KB_AGENT_FOO 1\n", encoding="utf-8")
    assert config_warnings(environ={}, dotenv=f) == [f"{f} line 1 is not an assignment (NAME=value); it is ignored"]


def test_a_nul_in_a_value_says_the_file_it_was_set_in(tmp_path):
    """Every other bad value says where it was set; one holding a NUL (which only a file can
    hold) was "KB_AGENT_TOP_K=3\\x00 is not valid: expected a value without NUL characters"."""
    f = tmp_path / ".env"
    f.write_bytes(b"KB_AGENT_TOP_K=3\x00\n")
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ={}, dotenv=f)
    assert str(caught.value) == f"KB_AGENT_TOP_K=3\\x00 is not valid: expected a value without NUL characters (set in {f})"


def test_a_secret_under_a_name_with_a_space_is_still_masked(tmp_path):
    """``set GITHUB_TOKEN=...`` is warned about as no assignment, yet its value stays among the
    secrets crag masks, as it was while the line was read as a name holding a space."""
    f = tmp_path / ".env"
    f.write_text("set GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789\n", encoding="utf-8")
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123456789" in secret_values(environ={}, dotenv=f)
    assert config_warnings(environ={}, dotenv=f) == [
        f"{f} line 1 is not an assignment (NAME=value); it is ignored"]
