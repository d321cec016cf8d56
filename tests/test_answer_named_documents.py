"""A question that names a document crag reads (``see docs/guide.pdf``) is pointed at its source.

crag indexes PDF and DOCX files through their readers; a question naming one ("... see
docs/guide.pdf") names where the answer is, as it does for ``docs/setup.md``: the path is no
term the evidence must write, and an answer read from that file is ``answered``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crag.prompts import find_paths
from tests.fakes import clean_env, cli, plan, route
from tests.openai_server import FakeOpenAIServer

QUESTION = "Which port does the narwhal service listen on? see docs/guide.pdf"
ANSWER = "The narwhal service listens on port 6060 [1]. It restarts nightly [1]."


@pytest.mark.parametrize("name", ["docs/guide.pdf", "report.docx", "site/index.xhtml", "notes/intro.adoc"])
def test_the_documents_crag_reads_are_paths_a_question_names(name: str) -> None:
    assert find_paths(f"What does {name} say about ports?") == (name,)


def test_an_answer_from_the_pdf_the_question_names_is_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
    from tests.test_readers import make_pdf

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    (tmp_path / "docs").mkdir()
    make_pdf(tmp_path / "docs" / "guide.pdf",
             [["Guide intro page."], ["Chapter two.", "The narwhal service listens on port 6060.", "It restarts nightly."]])
    assert cli("index", "docs")[0] == 0
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        srv.script("analyze_and_route", route("simple", ("read_file",)))
        srv.script("plan", plan(("read_file", {"path": "docs/guide.pdf", "page": 2})))
        srv.script("synthesize", ANSWER)
        code, out, err = cli("ask", "--json", QUESTION)
    assert code == 0, err
    result = json.loads(out)
    assert result["grounding"]["verdict"] == "answered"
    assert result["body"].startswith("The narwhal service listens on port 6060 [1].")
    assert not any(e["event"] == "question_not_addressed" for e in result["audit"])
    assert result["citations"][0]["path"] == "docs/guide.pdf" and result["citations"][0]["page"] == 2
