"""A citation the model invents points at no evidence: it is removed, never judged as a claim.

SPEC §7: "markers that point at no evidence are removed". A model cites as crag's footer does
(``docs/setup.md:L40``), in brackets, in parentheses or after "see"; a reference of that form
that no evidence item holds (a file crag never found, a line outside the item) is such a
marker. It used to stay in the sentence as an anchor no item holds, so a right sentence was
unsupported and a right answer on the simple path became the no-evidence sentence. A marker
in parentheses that goes takes its parentheses with it: "(see [9])" left "(see)" behind.
"""

from __future__ import annotations

import json

import pytest

from crag.grounding import ground
from crag.state import EvidenceItem
from tests.fakes import cli, plan, route
from tests.openai_server import FakeOpenAIServer

SETUP = EvidenceItem("vector_search", "docs/setup.md", "# Setup\n\nThe server listens on port 8080 by default.",
                     1, 3, 0.7)
RIGHT = "The server listens on port 8080 by default [1]."


@pytest.mark.parametrize("reference", [
    " (see [9])", " (see docs/other.md:L3)", " (docs/other.md:L3)", " [docs/other.md:L3]",
    ", see docs/other.md:L3", " (see docs/setup.md:L99)", " (source: docs/other.md:L3-L9)", " (cf. [4])",
    " ([7])", " (see docs/setup.md:L0)", f" (see docs/setup.md:L{'9' * 5000})",  # int() refuses that line
])
def test_a_reference_to_no_evidence_goes_with_its_brackets(reference: str) -> None:
    g = ground(f"The server listens on port 8080 by default{reference}.", (SETUP,))
    assert g.body == RIGHT
    assert g.report.supported == 1 and g.report.unsupported == ()


def test_a_reference_the_evidence_holds_stays_a_marker() -> None:
    g = ground("The server listens on port 8080 by default (see docs/setup.md:L3).", (SETUP,))
    assert g.body == "The server listens on port 8080 by default (see [1])."


@pytest.mark.parametrize("reference", [
    " (see docs/setup.md)", " [docs/setup.md]", " (docs/setup.md)", " (source: `docs/setup.md`)", "; see docs/setup.md",
])
def test_the_evidence_file_cited_without_a_line_is_its_marker(reference: str) -> None:
    """A model cites the file an item came from by its path alone: left as written, the path
    was an identifier no passage holds, and a right answer was refused."""
    g = ground(f"The server listens on port 8080 by default{reference}.", (SETUP,))
    assert g.report.supported == 1 and g.report.unsupported == ()
    assert "docs/setup.md" not in g.body and "[1]" in g.body


def test_a_path_in_prose_or_in_code_is_left_as_written() -> None:
    g = ground("Edit `docs/other.md:L3` to change the port 8080 the server listens on by default.", (SETUP,))
    assert "`docs/other.md:L3`" in g.body
    prose = ground("As docs/setup.md says, the server listens on port 8080 by default.", (SETUP,))
    assert prose.body.startswith("As docs/setup.md says")


@pytest.mark.parametrize("link", ["[the setup guide](docs/setup.md)", "[docs/setup.md](docs/setup.md)"])
def test_a_markdown_link_to_the_evidence_file_stays_a_link(link: str) -> None:
    """A link's target (or its text) in parentheses or brackets is no citation: made a marker,
    it left a broken link, "[the setup guide]([1])"."""
    g = ground(f"The server listens on port 8080 by default [1]; {link} has more.", (SETUP,))
    assert link in g.body and "([1])" not in g.body


@pytest.mark.parametrize("text", [
    "The default port is in the setup guide (docs/setup.md) [1].",
    "The setup guide (docs/setup.md) says the server listens on port 8080 by default.",
])
def test_a_path_in_parentheses_inside_the_clause_names_its_file(text: str) -> None:
    """Not a citation but the file the sentence talks about: made a marker, it went with the
    markers of a sentence judged unsupported, and "which file" lost its answer."""
    assert "(docs/setup.md)" in ground(text, (SETUP,)).body


def test_ask_answers_when_the_model_adds_a_reference_it_invented(tmp_path, monkeypatch) -> None:
    from tests.fakes import clean_env

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "setup.md").write_text("# Setup\n\nThe server listens on port 8080 by default.\n")
    assert cli("index", "docs")[0] == 0
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        srv.script("analyze_and_route", route("simple"))
        srv.script("plan", plan(("vector_search", {"query": "server port"})))
        srv.script("synthesize", "The server listens on port 8080 by default (see docs/other.md:L3).")
        code, out, err = cli("ask", "--json", "Which port does the server listen on?")
    assert code == 0, err
    result = json.loads(out)
    assert result["body"] == RIGHT
    assert result["grounding"]["verdict"] == "answered"
    assert [(c["path"], c["line"]) for c in result["citations"]] == [("docs/setup.md", 3)]


def test_a_reference_inside_a_clause_is_left_as_written() -> None:
    g = ground("Please see docs/other.md:L3 for the port 8080 the server listens on by default.", (SETUP,))
    assert "see docs/other.md:L3 for" in g.body


BACKUP = EvidenceItem("grep_search", "docs/backup.md", "# Backups\n\nA backup is kept for thirty days.", 1, 3)


@pytest.mark.parametrize("written", ["【{k}】", "【{k}†source】", "【{k}:0†setup.md】", " [{sup}]", " [[{k}]]", " [{k}]]]",
                                     " [[{k}]"])
def test_a_lenticular_superscript_or_double_bracketed_marker_is_the_marker_of_that_item(written: str) -> None:
    """OpenAI's models, used to their file search, cite as 【2】 or 【4:0†source】: the number
    was read as a claim of the sentence (no item holds a "2"), and a right answer went.
    ``[¹]`` was no marker: grounding placed its own beside it ("... 8080 [¹] [1]."); in
    ``[[2]]`` the marker was dropped and its brackets left ("... days [] [2]."), and ``[1]]]``
    kept its stray brackets ("... days [2]]].")."""
    def mark(k: int) -> str:
        return written.format(k=k, sup="¹²"[k - 1])

    g = ground(f"A backup is kept for thirty days{mark(2)}. "
               f"The server listens on port 8080 by default{mark(1)}.", (SETUP, BACKUP))
    assert g.body == "A backup is kept for thirty days [1]. The server listens on port 8080 by default [2]."
    assert g.report.supported == 2


def test_a_lenticular_marker_naming_no_item_goes() -> None:
    g = ground("The server listens on port 8080 by default【7】.", (SETUP,))
    assert g.body == RIGHT


def test_a_double_bracketed_marker_naming_no_item_goes_whole_and_code_keeps_its_brackets() -> None:
    g = ground("The server listens on port 8080 by default [[7]].", (SETUP,))
    assert g.body == RIGHT
    g = ground("The server listens on port 8080 by default [[1]]. Write `a[[1]]` as written:\n\n"
               "```python\nb = [[1]]\n```\n", (SETUP,))
    assert g.body.startswith(RIGHT) and "`a[[1]]`" in g.body and "b = [[1]]\n" in g.body
