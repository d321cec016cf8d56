"""Settings from the environment and .env (SPEC §3)."""

from __future__ import annotations

import os
import re

import pytest

from crag.cli import main
from crag.config import SETTINGS_TABLE, Settings
from crag.errors import ConfigError


def test_defaults():
    s = Settings.from_env(environ={}, dotenv=None)
    assert (s.max_iterations, s.auto_approve_max_items, s.vector_score_threshold) == (3, 2, 0.8)
    assert (s.drop_threshold, s.generate_threshold, s.top_k, s.index_dir) == (0.3, 0.7, 5, ".crag")
    assert (s.llm, s.model, s.llm_timeout, s.llm_max_retries) == ("offline", "gpt-4o-mini", 60.0, 3)
    assert (s.embedder, s.embedding_model, s.web_fetch) == ("hash", "text-embedding-3-small", False)


@pytest.mark.parametrize("var", ["OPENAI_API_KEY", "OPENAI_BASE_URL"])
def test_openai_backend_is_the_default_when_a_key_or_url_is_set(var):
    value = "http://127.0.0.1:9/v1" if var == "OPENAI_BASE_URL" else "sk-test"
    assert Settings.from_env(environ={var: value}, dotenv=None).llm == "openai"


def test_environment_wins_over_dotenv(tmp_path):
    f = tmp_path / ".env"
    f.write_text('# comment\nexport KB_AGENT_TOP_K=9\nKB_AGENT_MODEL="llama3.1"\nKB_AGENT_MAX_ITERATIONS=5\n')
    s = Settings.from_env(environ={"KB_AGENT_MAX_ITERATIONS": "2"}, dotenv=f)
    assert (s.top_k, s.model, s.max_iterations) == (9, "llama3.1", 2)


@pytest.mark.parametrize(("line", "value"), [
    ('OPENAI_API_KEY="sk-live-abc123"  # the team key', "sk-live-abc123"),
    ("OPENAI_API_KEY='sk-live-abc123' # the team key", "sk-live-abc123"),
    ('OPENAI_API_KEY="sk-live #abc"', "sk-live #abc"),
    ("OPENAI_API_KEY=sk-live-abc123 # the team key", "sk-live-abc123"),
    ("OPENAI_API_KEY=sk#live", "sk#live"),
])
def test_a_quoted_dotenv_value_followed_by_a_comment_loses_its_quotes(tmp_path, line: str, value: str) -> None:
    """``KEY="value"  # comment`` kept the quotes in the value: a key sent with them is refused by the server."""
    from crag.environment import read_dotenv

    f = tmp_path / ".env"
    f.write_text(line + "\n", encoding="utf-8")
    assert read_dotenv(f) == {"OPENAI_API_KEY": value}


@pytest.mark.parametrize(
    "var, value",
    [
        ("KB_AGENT_MAX_ITERATIONS", "lots"),
        ("KB_AGENT_MAX_ITERATIONS", "0"),
        ("KB_AGENT_VECTOR_SCORE_THRESHOLD", "1.5"),
        ("KB_AGENT_DROP_THRESHOLD", "-0.1"),
        ("KB_AGENT_GENERATE_THRESHOLD", "nan"),
        ("KB_AGENT_AUTO_APPROVE_MAX_ITEMS", "-1"),
        ("KB_AGENT_LLM", "claude"),
        ("KB_AGENT_EMBEDDER", "bert"),
        ("KB_AGENT_LLM_TIMEOUT", "0"),
        ("KB_AGENT_WEB_FETCH", "maybe"),
        ("OPENAI_BASE_URL", "localhost:11434"),
        ("OPENAI_BASE_URL", "http://[::1:8080/v1"),  # an IPv6 address left open
        ("OPENAI_BASE_URL", "http://127.0.0.1:99999/v1"),
        ("OPENAI_BASE_URL", "http://127.0.0.1:80a/v1"),
        ("OPENAI_BASE_URL", "http:///v1"),
        ("OPENAI_BASE_URL", "http://127.0.0.1:0/v1"),
        ("KB_AGENT_EMBEDDING_BASE_URL", "http://host:port/v1"),
        # host names no resolver takes (an empty label, a label over 63 characters): the
        # connection raised UnicodeError out of the HTTP client, a traceback
        ("OPENAI_BASE_URL", "http://a..b/v1"),
        ("OPENAI_BASE_URL", "http://.../v1"),
        ("KB_AGENT_EMBEDDING_BASE_URL", "http://" + "x" * 70 + ".example.com/v1"),
        ("JIRA_BASE_URL", "https://jira..example.com"),
    ],
)
def test_malformed_value_names_the_variable(var, value):
    with pytest.raises(ConfigError) as info:
        Settings.from_env(environ={var: value}, dotenv=None)
    assert var in str(info.value) and "\n" not in str(info.value)


def test_cli_exits_2_on_a_base_url_no_client_can_connect_to(monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://[::1:8080/v1")
    assert main(["ask", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crag: error: OPENAI_BASE_URL=http://[::1:8080/v1 is not valid: expected an http:// or "
                          "https:// URL with a host and a port")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_exits_2_with_one_line_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", "lots")
    assert main(["ask", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crag: error: KB_AGENT_MAX_ITERATIONS=lots")
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("var", "value", "accepts"), [
    ("KB_AGENT_MAX_ITERATIONS", "1000000000", "an integer from 1 to 100"),
    ("KB_AGENT_MAX_ITERATIONS", "9" * 30, "an integer from 1 to 100"),
    ("KB_AGENT_MAX_ITERATIONS", "101", "an integer from 1 to 100"),
    ("KB_AGENT_LLM_MAX_RETRIES", "1000000000", "an integer from 0 to 10"),
    ("KB_AGENT_CONTEXT_TOKENS", "1000000000000", "an integer from 1024 to 10000000"),
])
def test_a_count_that_bounds_a_loop_has_a_ceiling(var, value, accepts, tmp_path):
    """``KB_AGENT_MAX_ITERATIONS=1000000000`` let a question that finds nothing go round for
    ever (offline, each round is a few milliseconds; on a server, three calls a round), and as
    many retries keep a question waiting on a server that is down: one line, exit status 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))},
           "KB_AGENT_LLM": "offline", "KB_AGENT_INDEX_DIR": str(tmp_path / "i"), var: value,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "crag", "ask", "x"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"crag: error: {var}={value} is not valid: expected {accepts} (set in the environment)\n"
    assert Settings(max_iterations=20).max_iterations == 20 and Settings(llm_max_retries=10).llm_max_retries == 10


def test_top_k_above_what_a_search_takes_is_refused_not_a_question_left_unsearched(tmp_path, monkeypatch) -> None:
    """``KB_AGENT_TOP_K=100`` (or ``ask --top-k 100``) was accepted, then the question's own
    ``vector_search`` asked for 100 hits, was refused as a tool error (at most 50) and the
    question was answered without its own search. A setting is checked where it is set."""
    import io
    import json

    from tests.fakes import clean_env

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "setup.md").write_text("# Setup\n\nThe server listens on port 8080.\n")
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    assert main(["index", "docs"], io.StringIO(), io.StringIO()) == 0

    with pytest.raises(ConfigError, match="from 1 to 50"):
        Settings(top_k=51)
    monkeypatch.setenv("KB_AGENT_TOP_K", "51")
    out, err = io.StringIO(), io.StringIO()
    assert main(["ask", "Which port does the server listen on?"], out, err) == 2 and out.getvalue() == ""
    assert err.getvalue() == ("crag: error: KB_AGENT_TOP_K=51 is not valid: expected an integer from 1 to 50 "
                              "(set in the environment)\n")
    monkeypatch.delenv("KB_AGENT_TOP_K")
    out, err = io.StringIO(), io.StringIO()
    assert main(["ask", "--top-k", "100", "Which port does the server listen on?"], out, err) == 2
    assert err.getvalue() == "crag: error: --top-k must be from 1 to 50, got 100\n"

    monkeypatch.setenv("KB_AGENT_TOP_K", "50")  # the most a search takes: the question is searched with it
    out, err = io.StringIO(), io.StringIO()
    assert main(["ask", "--json", "Which port does the server listen on?"], out, err) == 0, err.getvalue()
    audit = json.loads(out.getvalue())["audit"]
    assert not [e for e in audit if e["event"] == "tool_error"]
    assert json.loads(out.getvalue())["citations"][0]["path"] == "docs/setup.md"


def test_the_largest_window_reads_no_more_than_64_mib_of_a_stream_with_no_end(tmp_path) -> None:
    """KB_AGENT_CONTEXT_TOKENS=1000000000000 made ``ask - < /dev/zero`` read until memory ran out
    (a MemoryError traceback); the window now has a ceiling and a question one more."""
    import os
    import resource
    import subprocess
    import sys
    from pathlib import Path

    from crag.agent import input_limit

    assert input_limit(Settings(context_tokens=10_000_000)) == 64 * 2**20
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))},
           "KB_AGENT_LLM": "offline", "KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_CONTEXT_TOKENS": "10000000",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with open("/dev/zero", "rb") as zero:
        run = subprocess.run([sys.executable, "-m", "crag", "ask", "-"], stdin=zero, cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.startswith("crag: error: the question read from standard input is over "
                                                         "67,108,864 characters"), run.stderr[-300:]
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 1024 * 1024  # KiB: under 1 GB


def test_overrides_are_validated_like_the_environment():
    assert Settings.from_env(environ={}, dotenv=None, max_iterations=5).max_iterations == 5
    with pytest.raises(ConfigError, match="KB_AGENT_MAX_ITERATIONS"):
        Settings.from_env(environ={}, dotenv=None, max_iterations=0)
    with pytest.raises(ConfigError, match="max_iteration"):
        Settings.from_env(environ={}, dotenv=None, max_iteration=5)


def test_a_setting_given_as_an_argument_wins_over_a_bad_value_in_the_environment_or_dotenv(tmp_path):
    # As the environment wins over .env without .env's value being read, an argument wins over
    # both: a service passing top_k=3 is not stopped by a stray KB_AGENT_TOP_K=lots it overrides.
    dotenv = tmp_path / ".env"
    dotenv.write_text("KB_AGENT_LLM_TIMEOUT=soon\n", encoding="utf-8")
    environ = {"KB_AGENT_TOP_K": "lots"}
    settings = Settings.from_env(environ=environ, dotenv=dotenv, top_k=3, llm_timeout=5)
    assert (settings.top_k, settings.llm_timeout) == (3, 5)
    with pytest.raises(ConfigError, match=r"KB_AGENT_TOP_K=lots .*\(set in the environment\)$"):
        Settings.from_env(environ=environ, dotenv=dotenv, llm_timeout=5)
    with pytest.raises(ConfigError, match=r"KB_AGENT_LLM_TIMEOUT=soon .*\(set in .*\.env\)$"):
        Settings.from_env(environ=environ, dotenv=dotenv, top_k=3)


def test_drop_threshold_above_generate_threshold_is_refused():
    # Both set by the user: they conflict. (One set alone moves the other's default.)
    with pytest.raises(ConfigError, match="KB_AGENT_DROP_THRESHOLD"):
        Settings.from_env(
            environ={"KB_AGENT_DROP_THRESHOLD": "0.8", "KB_AGENT_GENERATE_THRESHOLD": "0.7"}, dotenv=None
        )


def test_an_error_across_settings_says_where_the_blamed_value_was_set(tmp_path):
    # docs/cli.md: "A value that is set but invalid is an error, which says where it was set".
    # The rules across settings (drop > generate, an answer budget over half the window) left it out.
    with pytest.raises(ConfigError, match=r"KB_AGENT_DROP_THRESHOLD=0.8 .*\(0.5\) \(set in the environment\)$"):
        Settings.from_env(environ={"KB_AGENT_DROP_THRESHOLD": "0.8", "KB_AGENT_GENERATE_THRESHOLD": "0.5"}, dotenv=None)
    dotenv = tmp_path / ".env"
    dotenv.write_text("KB_AGENT_MAX_ANSWER_TOKENS=5000\nKB_AGENT_CONTEXT_TOKENS=8192\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"KB_AGENT_MAX_ANSWER_TOKENS=5000 .*\(set in .*\.env\)$"):
        Settings.from_env(environ={}, dotenv=dotenv)
    with pytest.raises(ConfigError, match=r"\(given as an argument\)$"):
        Settings.from_env(environ={}, dotenv=None, max_answer_tokens=5000, context_tokens=8192)


def test_a_default_threshold_adapts_to_the_one_the_user_set():
    # KB_AGENT_DROP_THRESHOLD=0.8 alone was refused because of the *default* generate
    # threshold (0.7), and KB_AGENT_GENERATE_THRESHOLD=0.2 alone blamed KB_AGENT_DROP_THRESHOLD=0.3,
    # which the user never set. SPEC §3: only values the user set can conflict.
    drop = Settings.from_env(environ={"KB_AGENT_DROP_THRESHOLD": "0.8"}, dotenv=None)
    assert (drop.drop_threshold, drop.generate_threshold) == (0.8, 0.8)
    gen = Settings.from_env(environ={"KB_AGENT_GENERATE_THRESHOLD": "0.2"}, dotenv=None)
    assert (gen.drop_threshold, gen.generate_threshold) == (0.2, 0.2)
    assert Settings.from_env(environ={}, dotenv=None, generate_threshold=0.9).drop_threshold == 0.3
    assert Settings.from_env(environ={"KB_AGENT_DROP_THRESHOLD": "0.1"}, dotenv=None).generate_threshold == 0.7


def test_env_example_and_readme_document_every_setting():
    # SPEC §3: `.env.example` documents each setting; the README's table says it does too.
    from pathlib import Path

    from crag.config import OTHER_VARIABLES

    root = Path(__file__).resolve().parents[1]
    example = (root / ".env.example").read_text()
    table = [line for line in (root / "README.md").read_text().splitlines() if line.startswith("| `")]
    for var in [v for v, _ in SETTINGS_TABLE.values()] + list(OTHER_VARIABLES):
        assert var in example, var
        assert any(f"`{var}`" in line for line in table), var


# -- one record: each field carries its variable and its kind, checked in code too ---------------


@pytest.mark.parametrize(("name", "value", "var"), [
    ("max_iterations", 0, "KB_AGENT_MAX_ITERATIONS"),
    ("grounding", "banana", "KB_AGENT_GROUNDING"),
    ("vector_score_threshold", 1.5, "KB_AGENT_VECTOR_SCORE_THRESHOLD"),
    ("top_k", 2.5, "KB_AGENT_TOP_K"),
    ("web_fetch", "maybe", "KB_AGENT_WEB_FETCH"),
    ("llm", "claude", "KB_AGENT_LLM"),
    ("openai_base_url", "localhost:11434", "OPENAI_BASE_URL"),
])
def test_a_value_given_in_code_is_refused_like_the_same_value_in_the_environment(name, value, var):
    with pytest.raises(ConfigError) as in_code:
        Settings(**{name: value})
    with pytest.raises(ConfigError) as from_env:
        Settings.from_env(environ={var: str(value)}, dotenv=None)
    assert str(from_env.value) == f"{in_code.value} (set in the environment)"  # the same check, and where
    assert str(in_code.value).startswith(f"{var}=")


def test_bytes_given_in_code_are_read_as_the_text_they_hold(tmp_path):
    # A key read from a file in binary mode was taken as its repr: the model was sent the
    # header "Bearer b'sk-...'" and answered 401, a model name was "b'gpt-4o'".
    settings = Settings(openai_api_key=b"sk-abc123", model=b"gpt-4o", index_dir=os.fsencode(tmp_path))
    assert (settings.openai_api_key, settings.model, settings.index_dir) == ("sk-abc123", "gpt-4o", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^KB_AGENT_MODEL=.* is not valid: expected UTF-8 text"):
        Settings(model=b"caf\xe9")


def test_evolve_checks_again():
    from attrs import evolve

    with pytest.raises(ConfigError, match="KB_AGENT_MAX_ITERATIONS"):
        evolve(Settings(), max_iterations=0)


def test_modes_are_enums_that_read_and_print_as_the_word_a_user_sets():
    from crag.config import EmbedderKind, GroundingMode, LLMBackend, StructuredOutput

    s = Settings(grounding="STRICT", llm="openai", embedder="hash", structured_output="json_object")
    assert s.grounding is GroundingMode.STRICT and s.grounding == "strict" and f"{s.grounding}" == "strict"
    assert (s.llm, s.embedder, s.structured_output) == (LLMBackend.OPENAI, EmbedderKind.HASH,
                                                        StructuredOutput.JSON_OBJECT)
    assert Settings.from_env(environ={"KB_AGENT_GROUNDING": "Off"}, dotenv=None).grounding is GroundingMode.OFF


def test_every_setting_has_a_distinct_variable_and_its_default_reads_back_unchanged():
    from attrs import fields

    variables = [f.metadata["variable"] for f in fields(Settings)]
    assert len(set(variables)) == len(variables) == len(SETTINGS_TABLE)
    defaults = Settings()
    environ = {var: "" if value is None else ("on" if value is True else "off" if value is False else str(value))
               for var, value in ((SETTINGS_TABLE[f.name][0], getattr(defaults, f.name)) for f in fields(Settings))}
    assert Settings.from_env(environ=environ, dotenv=None) == defaults


def test_node_config_shows_the_nodes_the_settings_marked_for_them_and_nothing_else():
    from crag.nodes import NodeConfig

    cfg = NodeConfig(Settings(top_k=7, openai_api_key="sk-test"))
    assert (cfg.top_k, cfg.grounding, cfg.max_iterations) == (7, "note", 3)
    with pytest.raises(AttributeError):
        cfg.openai_api_key  # noqa: B018 - a key is not the nodes' business
    assert cfg.with_settings(context_tokens=2048, max_answer_tokens=512).context_tokens == 2048
    with pytest.raises(ConfigError, match="KB_AGENT_MAX_ANSWER_TOKENS"):
        cfg.with_settings(context_tokens=1024)


def test_the_default_answer_budget_adapts_to_a_small_window_only_a_set_one_conflicts():
    # KB_AGENT_CONTEXT_TOKENS=2000 alone was refused: the *default* answer budget (1024) is
    # over half of it. A default adapts to what the user set (SPEC §3).
    alone = Settings.from_env(environ={"KB_AGENT_CONTEXT_TOKENS": "2000"}, dotenv=None)
    assert (alone.context_tokens, alone.max_answer_tokens) == (2000, 1000)
    assert Settings.from_env(environ={}, dotenv=None, context_tokens=1500).max_answer_tokens == 750
    assert Settings.from_env(environ={"KB_AGENT_CONTEXT_TOKENS": "32768"}, dotenv=None).max_answer_tokens == 1024
    with pytest.raises(ConfigError, match=r"KB_AGENT_MAX_ANSWER_TOKENS=1500 .*at most half of KB_AGENT_CONTEXT_TOKENS \(2000\)"):
        Settings.from_env(environ={"KB_AGENT_CONTEXT_TOKENS": "2000", "KB_AGENT_MAX_ANSWER_TOKENS": "1500"}, dotenv=None)


def test_the_default_window_makes_room_for_a_larger_answer_budget_set_alone():
    """KB_AGENT_MAX_ANSWER_TOKENS=6000 alone was refused as over half of KB_AGENT_CONTEXT_TOKENS
    (8192), a value the user never set: only values the user set can conflict (SPEC §3)."""
    alone = Settings.from_env(environ={"KB_AGENT_MAX_ANSWER_TOKENS": "6000"}, dotenv=None)
    assert (alone.context_tokens, alone.max_answer_tokens) == (12000, 6000)
    assert Settings.from_env(environ={"KB_AGENT_MAX_ANSWER_TOKENS": "2000"}, dotenv=None).context_tokens == 8192
    assert Settings(max_answer_tokens=5000).context_tokens == 10000
    assert Settings().context_tokens == 8192
    with pytest.raises(ConfigError, match=r"KB_AGENT_MAX_ANSWER_TOKENS=5000001 .*an integer from 16 to 5000000"):
        Settings.from_env(environ={"KB_AGENT_MAX_ANSWER_TOKENS": "5000001"}, dotenv=None)  # its own bound, not a window never set


def test_a_base_url_whose_password_holds_an_unencoded_slash_is_refused_without_showing_it(monkeypatch, capsys):
    """``http://bob:Hunter2/Pw@host`` was refused for its "port" with the password on the
    screen, and ``http://bob:1234/Hunter3Pw@host`` was accepted, shown in errors and kept in
    the answer log: a URL parser reads up to the first ``/`` as the host and port."""
    from crag.environment import find_secrets

    for url in ("http://bob:Hunter2/Pw@127.0.0.1:18302/v1", "http://bob:1234/Hunter3Pw@127.0.0.1:18302/v1",
                "http://bob:Hunter4?Pw@127.0.0.1:18302/v1", "http://bob:12#Hunter5@127.0.0.1:18302/v1"):
        monkeypatch.setenv("JIRA_BASE_URL", url)
        assert main(["search", "hello"]) == 2
        err = capsys.readouterr().err
        assert re.match(r"crag: error: JIRA_BASE_URL=http://(bob:)?\*\*\*@127\.0\.0\.1:18302/v1 is not valid: expected an "
                        "http:// or https:// URL with each @ / [?] and # in its user name or password percent-encoded", err), err
        assert "Hunter" not in err and err.count("\n") == 1
        assert url.split("//")[1].split("@")[0].split(":", 1)[1] in find_secrets({"JIRA_BASE_URL": url})


@pytest.mark.parametrize(("var", "url", "shown"), [
    ("OPENAI_BASE_URL", "bob:Hunter2Pw@127.0.0.1:8080/v1", "***@127.0.0.1:8080/v1"),  # "http://" forgotten
    ("OPENAI_BASE_URL", "http://bob:Hunter2 Pw@127.0.0.1:8080/v1", "http://***@127.0.0.1:8080/v1"),
    ("KB_AGENT_EMBEDDING_BASE_URL", "http://bob:Hünter2Pw@127.0.0.1:8080/v1", "http://***@127.0.0.1:8080/v1"),
    ("JIRA_BASE_URL", "bob:Hunter2Pw@jira.example.com", "***@jira.example.com"),
])
def test_a_base_url_no_parser_reads_is_refused_without_showing_its_password(var, url, shown):
    """A URL with no scheme, or with a space or a letter outside ASCII in its password, was
    refused with the password in the error: the masking looked for ``scheme://user:password@``
    without a space, and a value given in code is not among the configured secrets."""
    name = next(field for field, (variable, _) in SETTINGS_TABLE.items() if variable == var)
    for build in (lambda: Settings(**{name: url}), lambda: Settings.from_env(environ={var: url}, dotenv=None)):
        with pytest.raises(ConfigError) as refused:
            build()
        assert str(refused.value).startswith(f"{var}={shown} is not valid: expected an http:// or https:// URL")
        assert "Hunter" not in str(refused.value) and "Hünter" not in str(refused.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:18601/v1/@cf", "http://127.0.0.1:18601/v1?tenant=a@b",
                                 "https://llm.example.com/proxy/user@example.com/v1", "http://gw:8080/v1/@team"])
def test_a_base_url_with_an_at_sign_in_its_path_and_no_password_is_a_url(url):
    """The check for passwords holding an unencoded / refused these (and hid their host), and
    took part of any *_URL holding "/@" (an npm registry's) for a secret to mask everywhere."""
    from crag.environment import find_secrets

    assert Settings.from_env(environ={"OPENAI_BASE_URL": url}, dotenv=None).openai_base_url == url
    assert find_secrets({"OPENAI_BASE_URL": url, "PACKAGE_URL": "https://registry.npmjs.org/@myorg/widgets"}) == ()


def test_settings_built_in_code_adapt_their_defaults_as_from_env_does():
    # Settings(context_tokens=1024) blamed KB_AGENT_MAX_ANSWER_TOKENS=1024, and
    # Settings(generate_threshold=0.2) KB_AGENT_DROP_THRESHOLD=0.3: defaults the caller never
    # set (SPEC §3: only values the user set can conflict). Agent(chat_model, toolbox, Settings(...)).
    assert Settings(context_tokens=1024).max_answer_tokens == 512
    assert Settings(context_tokens=32768).max_answer_tokens == 1024
    assert (Settings(drop_threshold=0.8).drop_threshold, Settings(drop_threshold=0.8).generate_threshold) == (0.8, 0.8)
    assert (Settings(generate_threshold=0.2).drop_threshold, Settings(generate_threshold=0.2).generate_threshold) == (0.2, 0.2)
    assert (Settings().drop_threshold, Settings().generate_threshold, Settings().max_answer_tokens) == (0.3, 0.7, 1024)
    with pytest.raises(ConfigError, match="KB_AGENT_MAX_ANSWER_TOKENS=1024"):
        Settings(context_tokens=1024, max_answer_tokens=1024)  # both set: they conflict
    with pytest.raises(ConfigError, match=r"KB_AGENT_DROP_THRESHOLD=0\.8"):
        Settings(drop_threshold=0.8, generate_threshold=0.5)


def test_the_repr_of_settings_shows_no_secret():
    # print(agent.settings), a log line or a failing assertion showed the API key, the tokens
    # and a URL's password in full.
    settings = Settings(llm="openai", openai_api_key="sk-live-Zq8Xw2'Lm5Np7", openai_base_url="http://bob:pw-S3cret@h:1/v1",
                        jira_api_token="jt-0123456789abcdef", jira_base_url="https://jira.example", confluence_api_token="x1")
    shown = repr(settings)
    for secret in ("Zq8Xw2", "pw-S3cret", "jt-0123456789abcdef", "'x1'"):
        assert secret not in shown and secret not in str(settings)
    assert "openai_api_key='***'" in shown and "http://bob:***@h:1/v1" in shown and "model='gpt-4o-mini'" in shown
    assert "openai_api_key=''" in repr(Settings())  # nothing hidden where there is nothing


# -- names given in code: a crag error that names the setting, never the value ---------------------


@pytest.mark.parametrize("build", [lambda **kw: Settings(**kw), lambda **kw: Settings.from_env(environ={}, dotenv=None, **kw)])
def test_an_unknown_setting_name_is_a_config_error_naming_it_and_the_closest_and_known_ones(build) -> None:
    """``Settings(foo=1)`` was a bare TypeError from attrs, and ``from_env(openai_key="sk-...")``
    printed the mistyped key's value in its message."""
    with pytest.raises(ConfigError) as caught:
        build(openai_key="sk-live-SECRET-123")
    message = str(caught.value)
    assert message.startswith("openai_key is not a crag setting; did you mean openai_api_key?"), message
    assert "SECRET" not in message and "SECRET" not in repr(caught.value) and caught.value.value is None
    assert "max_iterations" in message and "top_k" in message and "\n" not in message  # the known ones, one line
    with pytest.raises(ConfigError, match=r"^KB_AGENT_TOP_K is not a crag setting; did you mean top_k\?"):
        build(KB_AGENT_TOP_K=8)  # the variable's name where the field's is meant
    with pytest.raises(ConfigError, match=r"^foo is not a crag setting \(the settings:"):
        build(foo=1)


def test_settings_are_given_by_name_not_by_position() -> None:
    """``Settings(1)`` quietly set ``max_iterations``, the first field in ``.env.example``'s order."""
    from crag.errors import UsageError

    with pytest.raises(UsageError, match=r"^Settings takes each setting by its name"):
        Settings(1)


def test_a_server_given_in_code_switches_the_backend_to_openai_as_it_does_in_the_environment(tmp_path) -> None:
    """``Agent.from_env(openai_base_url=...)`` answered offline: only the environment's
    OPENAI_BASE_URL and OPENAI_API_KEY chose the ``openai`` backend (SPEC §3)."""
    url = "http://127.0.0.1:9/v1"
    assert Settings.from_env(environ={}, dotenv=None, openai_base_url=url).llm == "openai"
    assert Settings.from_env(environ={}, dotenv=None, openai_api_key="sk-test").llm == "openai"
    assert Settings(openai_base_url=url).llm == "openai" and Settings().llm == "offline"
    # A backend the user chose stays chosen, wherever it was set.
    assert Settings(openai_base_url=url, llm="offline").llm == "offline"
    assert Settings.from_env(environ={"KB_AGENT_LLM": "offline"}, dotenv=None, openai_base_url=url).llm == "offline"
    assert Settings.from_env(environ={"OPENAI_BASE_URL": url}, dotenv=None, llm="offline").llm == "offline"
    assert Settings.from_env(environ={"OPENAI_BASE_URL": "  "}, dotenv=None).llm == "offline"


@pytest.mark.parametrize(("var", "value"), [
    ("KB_AGENT_TOP_K", "1_0"),  # Python's digit grouping: no shell or .env reader takes it as 10
    ("KB_AGENT_MAX_ITERATIONS", "\uff15"),  # a fullwidth 5
    ("KB_AGENT_MAX_ITERATIONS", "\u0663"),  # an Arabic-Indic 3
    ("KB_AGENT_LLM_TIMEOUT", "1_0"),
    ("KB_AGENT_LLM_TIMEOUT", "\uff15"),
    ("KB_AGENT_TEMPERATURE", "0.5_0"),
    ("KB_AGENT_DROP_THRESHOLD", "0.1_5"),
])
def test_a_number_is_written_in_ascii_digits_without_underscores(var, value):
    """``KB_AGENT_TOP_K=1_0`` ran with 10 and ``KB_AGENT_MAX_ITERATIONS=５`` with 5: Python's
    int() reads both, nothing else a user configures with does."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env(environ={var: value}, dotenv=None)
    assert var in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("var", "value", "read"), [
    ("KB_AGENT_MAX_ITERATIONS", " 3 ", 3), ("KB_AGENT_MAX_ITERATIONS", "+3", 3),
    ("KB_AGENT_LLM_TIMEOUT", "1e2", 100.0), ("KB_AGENT_LLM_TIMEOUT", ".5", 0.5),
    ("KB_AGENT_TEMPERATURE", "1.", 1.0), ("KB_AGENT_DROP_THRESHOLD", "0.25", 0.25),
])
def test_plain_numbers_still_read(var, value, read):
    s = Settings.from_env(environ={var: value}, dotenv=None)
    assert getattr(s, SETTINGS_FIELD[var]) == read


SETTINGS_FIELD = {var: name for name, (var, _) in SETTINGS_TABLE.items()}


@pytest.mark.parametrize(("line", "field", "value"), [
    ("KB_AGENT_CONTEXT_TOKENS=1024", "max_answer_tokens", 512),  # a llama.cpp --ctx-size 1024
    ("KB_AGENT_DROP_THRESHOLD=0.8", "generate_threshold", 0.8),
    ("KB_AGENT_GENERATE_THRESHOLD=0.2", "drop_threshold", 0.2),
])
def test_env_example_copied_and_edited_keeps_the_defaults_that_adapt(tmp_path, line, field, value):
    """``cp .env.example .env`` then ``KB_AGENT_CONTEXT_TOKENS=1024`` (as its comment says: match
    the server) stopped crag with exit 2, because the copy set KB_AGENT_MAX_ANSWER_TOKENS=1024,
    a value the user never chose: a default that adapts is left commented out in the example."""
    from pathlib import Path

    example = (Path(__file__).resolve().parents[1] / ".env.example").read_text(encoding="utf-8")
    var = line.partition("=")[0]
    # the user's edit: the setting's line, uncommented where the example comments it out
    edited = "\n".join(line if text.removeprefix("# ").startswith(var + "=") else text for text in example.splitlines())
    assert line in edited
    (tmp_path / ".env").write_text(edited + "\n", encoding="utf-8")
    assert getattr(Settings.from_env(environ={}, dotenv=tmp_path / ".env"), field) == value


@pytest.mark.parametrize("empty", ["", "   ", "\t"])
def test_a_setting_set_to_nothing_has_its_default_and_still_wins_over_dotenv(tmp_path, empty):
    f = tmp_path / ".env"
    f.write_text("KB_AGENT_MAX_ITERATIONS=5\nKB_AGENT_TOP_K=9\n", encoding="utf-8")
    s = Settings.from_env(environ={"KB_AGENT_MAX_ITERATIONS": empty, "KB_AGENT_MODEL": empty}, dotenv=f)
    assert (s.max_iterations, s.model, s.top_k) == (3, "gpt-4o-mini", 9)


@pytest.mark.parametrize(("value", "said"), [
    ("sk-\udcffabc", "bytes that are not UTF-8"),  # a byte the shell passed through undecoded
    ("sk-abc\u200b", "an invisible character"),  # a zero-width space from a paste
    ("sk-abc\x01", "a control character"),
    ("sk-ab\u00e9", "a non-ASCII character"),
    ("sk-ab c", "a space"),
])
def test_a_malformed_key_is_described_without_being_shown(value, said):
    """A key holding a byte that is not UTF-8 was said to hold "a control character"."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env(environ={"OPENAI_API_KEY": value}, dotenv=None)
    message = str(info.value)
    assert f"it contains {said};" in message and "sk-ab" not in message


@pytest.mark.parametrize("given", ["environment", "argument"])
def test_a_top_k_larger_than_any_search_returns_is_refused_naming_the_range(given, monkeypatch, capsys, tmp_path):
    """``KB_AGENT_TOP_K=1000`` was accepted, and then every question's own search was a tool
    error (``argument 'top_k' must be between 1 and 50``): the question went on unsearched.
    A search returns at most 50 hits, so the setting (and ``--top-k``) says so at once."""
    from crag.toolspec import MAX_TOP_K

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    argv = ["ask", "how do uploads retry"]
    if given == "environment":
        monkeypatch.setenv("KB_AGENT_TOP_K", "51")
        said, where = "KB_AGENT_TOP_K=51", "set in the environment"
    else:
        argv += ["--top-k", "51"]
        said, where = "--top-k", "given as an argument"
    assert main(argv) == 2
    err = capsys.readouterr().err
    if given == "environment":
        assert err.startswith(f"crag: error: {said} is not valid: expected an integer from 1 to {MAX_TOP_K} ({where}")
    else:  # the option is checked as an option, in its own words
        assert err == f"crag: error: --top-k must be from 1 to {MAX_TOP_K}, got 51\n"
    assert err.count("\n") == 1
    assert Settings(top_k=MAX_TOP_K).top_k == MAX_TOP_K
    with pytest.raises(ConfigError, match="KB_AGENT_TOP_K"):
        Settings(top_k=MAX_TOP_K + 1)


def test_a_count_too_large_for_any_use_says_its_bound_not_only_its_sign():
    """A 5,000-digit KB_AGENT_AUTO_APPROVE_MAX_ITEMS was refused as not "an integer >= 0"."""
    for value in ("9" * 5000, "1" + "0" * 18 + "1"):
        with pytest.raises(ConfigError, match=r"expected an integer from 0 to 10\^18"):
            Settings.from_env(environ={"KB_AGENT_AUTO_APPROVE_MAX_ITEMS": value}, dotenv=None)
    assert Settings.from_env(environ={"KB_AGENT_AUTO_APPROVE_MAX_ITEMS": "1" + "0" * 18}, dotenv=None).auto_approve_max_items == 10**18


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_given_in_code_for_a_number_is_named_as_written(value):
    # It was named by the text a switch reads it as ("KB_AGENT_TOP_K=on"), a value nobody set.
    with pytest.raises(ConfigError, match=rf"^KB_AGENT_TOP_K={value} is not valid: expected an integer"):
        Settings(top_k=value)
    assert Settings(web_fetch=value).web_fetch is value  # a switch reads it
    with pytest.raises(ConfigError, match=rf"^KB_AGENT_MODEL={value} is not valid: expected a value of its own kind"):
        Settings(model=value)  # was the model "on" (or "off"), a value nobody set


@pytest.mark.parametrize(("url", "accepts"), [
    ("http://127.0.0.1:18601/jira#frag", "without a ? query or # fragment, as crag appends the REST API's path to it"),
    ("https://jira.example.com/?os_authType=basic", "without a ? query or # fragment"),
    ("http://me:Passw0rdXYZ12@127.0.0.1:18601", "without a user name or password, which go in {p}_EMAIL and {p}_API_TOKEN"),
    ("http://me@127.0.0.1:18601/jira", "without a user name or password"),
])
def test_a_jira_or_confluence_base_url_the_tool_cannot_use_is_refused(monkeypatch, capsys, url, accepts):
    """A fragment or query swallowed the REST path ("issue OK-1 was not found"); a user and
    password were accepted, and every call then failed "URLs with a user name or password are refused"."""
    for prefix in ("JIRA", "CONFLUENCE"):
        monkeypatch.delenv("JIRA_BASE_URL", raising=False)
        monkeypatch.setenv(f"{prefix}_BASE_URL", url)
        assert main(["search", "hello"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"crag: error: {prefix}_BASE_URL=") and err.count("\n") == 1
        assert accepts.format(p=prefix) in err and "Passw0rd" not in err
        monkeypatch.delenv(f"{prefix}_BASE_URL")
    assert Settings.from_env(environ={"JIRA_BASE_URL": "https://jira.example.com/a@b/"}, dotenv=None).jira_base_url


def test_a_confluence_base_url_given_in_code_with_a_query_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^CONFLUENCE_BASE_URL=https://w\.example\.com/wiki\?x is not valid"):
        Settings(confluence_base_url="https://w.example.com/wiki?x")
