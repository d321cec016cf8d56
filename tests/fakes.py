"""Test doubles for the Toolbox port and small builders for evidence and replies."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from crag.errors import ToolError
from crag.state import EvidenceItem, ToolCall
from crag.tools import builtin
from crag.toolspec import Tool

LOCAL_TOOLS = ("vector_search", "grep_search", "read_file")


def item(
    n: int = 1,
    tool: str = "vector_search",
    score: float | None = 0.5,
    source: str | None = None,
    start: int | None = ...,  # type: ignore[assignment]
    end: int | None = ...,  # type: ignore[assignment]
    text: str | None = None,
) -> EvidenceItem:
    """A distinct evidence item; ``n`` makes source, lines and text unique.

    ``start=None`` makes an item without line numbers; leaving it out picks ``10 * n``.
    """
    start = 10 * n if start is ... else start
    if end is ...:
        end = start + 4 if start is not None else None
    return EvidenceItem(
        tool=tool,
        source=source or f"docs/page{n}.md",
        text=text or f"Evidence number {n} about the retry policy.",
        start_line=start,
        end_line=end,
        score=score,
    )


class FakeToolbox:
    """Toolbox port with queued results per tool; records every call it runs.

    A queued entry is a list of items, or an exception to raise. An empty queue returns no
    items (``default``), so a run can take more rounds than a test scripted.

    With ``question``, the first round's own search for the question (which crag always
    runs besides the planned calls) is answered with ``question_results`` and recorded in
    ``question_calls`` instead, so the queues and ``calls`` stay those of the planned calls.
    """

    def __init__(
        self,
        results: Mapping[str, Iterable[Sequence[EvidenceItem] | Exception]] | None = None,
        tools: Sequence[str | Tool] = LOCAL_TOOLS,
        question: str | None = None,
        question_results: Sequence[EvidenceItem] = (),
    ) -> None:
        self.records = tuple(t if isinstance(t, Tool) else builtin(t)[0] for t in tools)
        self.queues = {k: deque(v) for k, v in (results or {}).items()}
        self.calls: list[ToolCall] = []
        self.question = question
        self.question_results = tuple(question_results)
        self.question_calls: list[ToolCall] = []

    def tools(self) -> tuple[Tool, ...]:
        return self.records

    def run(self, call: ToolCall) -> list[EvidenceItem]:
        if self.question is not None and call.tool == "vector_search" and _same(call.args.get("query"), self.question):
            self.question_calls.append(call)
            return list(self.question_results)
        self.calls.append(call)
        queue = self.queues.get(call.tool)
        if not queue:
            return []
        result = queue.popleft()
        if isinstance(result, Exception):
            raise result if isinstance(result, ToolError) else ToolError(call.tool, str(result))
        return list(result)


def _same(a: object, b: str) -> bool:
    return isinstance(a, str) and " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def route(complexity: str, tools: Sequence[str] = ("vector_search",)) -> str:
    return json.dumps({"complexity": complexity, "suggested_tools": list(tools)})


def plan(*calls: tuple[str, dict]) -> str:
    return json.dumps({"tool_calls": [{"tool": t, "args": a} for t, a in calls]})


def search_plan(query: str = "retry policy") -> str:
    return plan(("vector_search", {"query": query}))


def scores(*values: float) -> str:
    return json.dumps(list(values))


def clean_env(monkeypatch) -> None:
    """Remove every crag, OpenAI, Jira and Confluence variable, so a test sees only what it sets."""
    for key in list(os.environ):
        if key.startswith(("KB_AGENT_", "OPENAI_", "JIRA_", "CONFLUENCE_")):
            monkeypatch.delenv(key)


def cli(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``crag.cli.main`` in this process: its exit status, stdout and stderr."""
    import io

    from crag.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err, io.StringIO(stdin) if stdin is not None else None)
    return code, out.getvalue(), err.getvalue()
