"""A sentence that joins two facts, each with its own marker, is judged clause by clause.

"The kiwi server listens on port 8080 [1] and the kiwi client retries uploads three times
[2]." is how models join two pages in one sentence. No item holds it whole, and the clause
cut was only after commas and semicolons, so the right sentence was unsupported and, on the
simple path, the answer became the no-evidence sentence. The model's own markers end its
clauses: a marker followed by more of the sentence is a cut too.
"""

from __future__ import annotations

import json

from crag.grounding import clauses, ground
from crag.state import EvidenceItem
from tests.fakes import clean_env, cli, plan, route
from tests.openai_server import FakeOpenAIServer

SERVER = EvidenceItem("grep_search", "docs/a.md", "# A\n\nThe kiwi server listens on port 8080 by default.", 1, 3)
CLIENT = EvidenceItem("grep_search", "docs/b.md", "# B\n\nThe kiwi client retries uploads three times.", 1, 3)
JOINED = "The kiwi server listens on port 8080 by default [1] and the kiwi client retries uploads three times [2]."


def test_a_marker_inside_a_sentence_ends_a_clause() -> None:
    assert clauses(JOINED) == ["The kiwi server listens on port 8080 by default [1] ",
                               "and the kiwi client retries uploads three times [2]."]
    # a comma inside a marker is no clause break
    assert clauses("The kiwi server listens on port 8080 by default [1, 2].") == [
        "The kiwi server listens on port 8080 by default [1, 2]."]


def test_two_facts_with_their_own_markers_are_both_supported() -> None:
    g = ground(JOINED, (SERVER, CLIENT))
    assert g.body == JOINED
    assert g.report.sentences == 1 and g.report.supported == 1
    assert [(s.source, s.start_line) for s in g.sources] == [("docs/a.md", 3), ("docs/b.md", 3)]


def test_an_invented_clause_after_a_marker_is_still_caught() -> None:
    g = ground("The kiwi server listens on port 8080 by default [1] and the kiwi client retries uploads seven "
               "times [2].", (SERVER, CLIENT))
    assert g.report.supported == 0 and g.report.judgements[0].rule == "clauses"
    assert g.body == ("The kiwi server listens on port 8080 by default [1] and the kiwi client retries uploads seven "
                      "times [unsupported].")


def test_ask_keeps_the_answer_that_joins_two_pages(tmp_path, monkeypatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nThe kiwi server listens on port 8080 by default.\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n\nThe kiwi client retries uploads three times.\n")
    assert cli("index", "docs")[0] == 0
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        srv.script("analyze_and_route", route("simple", ("grep_search",)))
        srv.script("plan", plan(("grep_search", {"pattern": "kiwi"})))
        srv.script("synthesize", JOINED)
        code, out, err = cli("ask", "--json", "Which port does the kiwi server use and how often does the kiwi client retry?")
    assert code == 0, err
    result = json.loads(out)
    assert result["body"] == JOINED
    assert result["grounding"]["verdict"] == "answered"
    assert [(c["path"], c["line"]) for c in result["citations"]] == [("docs/a.md", 3), ("docs/b.md", 3)]


def test_strict_keeps_a_sentence_whose_every_clause_is_supported() -> None:
    """``strict`` removes a sentence with an unsupported clause whole; one whose clauses are
    all supported has nothing to remove, and the answer is not refused for it."""
    g = ground(JOINED, (SERVER, CLIENT), mode="strict")
    assert g.body == JOINED and g.report.supported == 1
    g = ground("The kiwi server listens on port 8080 by default [1] and the kiwi client retries uploads seven "
               "times [2].", (SERVER, CLIENT), mode="strict")
    assert g.body.strip() == "" or "seven" not in g.body
