"""The offline backend: every node answered by rules, with no network and no LLM.

``OfflineChatModel`` implements the ``ChatModel`` port from the structured task of each
request (it never reads the rendered prompt), and its reply text follows the same wire
contract as a real model's, so it goes through the same strict parsers:

* analyze_and_route: greetings, thanks and small talk are ``chitchat``; a question naming
  an identifier, a path, a Jira key, a URL or asking for one fact ("what is X") is
  ``simple``; the rest is ``complex``. Tools are suggested by what the question contains.
* plan: the question's own search (``vector_search``) for the question; the term search
  (``grep_search``) for identifiers; the file reader (``read_file``) for named paths;
  remote tools only with their argument in the question. Which tool plays which part is
  read from the records (``searches``, ``path_arg``), not from names. Later rounds
  vary the calls (keywords only, a larger ``top_k``, terms learnt from the evidence,
  reading around the best hit) so a retry never repeats itself. A follow-up question (one
  with earlier turns) is also searched with the keywords of the previous user turn.
* grade_evidence: one score per item from the share of the question's keywords the item
  covers, as a whole and in its best few lines.
* synthesize: an extractive answer, the evidence sentences (and at most one code block) that
  best match the question, quoted verbatim with ``[K]`` citations under a line saying no LLM
  wrote it. Only whitespace changes (a sentence wrapped over lines is put on one, a code
  block inside a list or quote loses that indentation); a file of code or settings (by its
  name: ``upload.py``, ``settings.yaml``) is quoted as its lines around the best match, as
  written, in a code block (``crag.llm.quotes``); a DOCX is quoted line by line (a line is a
  paragraph there, never wrapped prose); short title lines above a sentence (a PDF
  page's header) are not quoted as its start; a sentence holding HTML, a
  ``[n]``-like bracket, an admonition marker or nothing but links is not quoted, so every
  marker points at an item, nor is an Org file's markup (``#+BEGIN_QUOTE``, ``** Sub``); a
  table is quoted with its brackets, its marker below it (``crag.answer.code_split``).
  Lines inside a code block whose fence lies above the item's text in its file (a chunk of
  a long block, an excerpt) are code too (``code_context``).
  Chitchat gets a short friendly reply.

Every ``Completion`` is ``billable=False`` with zero tokens and ``model="offline"``, so the
usage block shows 0 calls; latency is still measured. Replies are deterministic.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from attrs import frozen

from .. import prompts
from ..answer import NO_QUOTABLE, OFFLINE_PREFACE
from ..config import Settings
from ..errors import LLMError
from ..pages import location
from ..ports import AnalyzeTask, GradeTask, LLMRequest, PlanTask, SynthesizeTask
from ..searches import is_small_talk
from ..state import Completion, EvidenceItem, Message, ToolRun
from ..text import STOPWORDS, in_vocabulary, keywords
from ..text import words as split_words
from ..toolspec import MAX_TOP_K, ArgumentError, Searches, Tool, check_args, clip, question_search, search_tools
from .code_context import FileLines, opening_fence
from .quotes import code_file, code_quotes, item_quotes, same_text, table_excerpt, words_of

__all__ = ["OFFLINE_PREFACE", "OfflineChatModel", "keywords"]

_THANKS = re.compile(r"\b(?:thanks|thank\s+you|thx|cheers|appreciate)|谢谢|多谢|merci|danke|gracias", re.I)
_BYE = re.compile(r"\b(?:bye|goodbye|see\s+(?:you|ya)|good\s+night)|再见", re.I)
_ABOUT_ME = re.compile(r"\b(?:who\s+are\s+you|what\s+are\s+you|what\s+can\s+you\s+do|help)\b", re.I)

_FACT_QUESTION = re.compile(
    r"^\s*(?:what\s+(?:is|are|was|does)|what's|whats|define|definition\s+of|meaning\s+of|who\s+(?:is|owns|maintains)|"
    r"where\s+(?:is|are|do|does)|which\s+(?:file|setting|variable|option|command|port|version)|"
    r"when\s+(?:is|was|did)|is\s+there|does\s+\S+\s+support)\b",
    re.I,
)
_COMPLEX_MARKER = re.compile(
    r"\b(?:and\s+(?:how|why|what|when|where)|compare|comparison|versus|vs\.?|difference|differences|"
    r"why|how|steps|explain|troubleshoot|debug|pros|cons|trade-?offs?|between|relationship|impact)\b",
    re.I,
)

_MAX_QUOTES = 5
_PER_ITEM = 2


def overlap(question_words: Sequence[str], text: str) -> float:
    """Share of ``question_words`` found in ``text`` (prefix matches count), 0..1."""
    if not question_words:
        return 0.0
    vocabulary = set(keywords(text))
    return sum(1 for w in question_words if in_vocabulary(w, vocabulary)) / len(question_words)


def _follow_up_terms(history: Sequence[Message], words: Sequence[str]) -> list[str]:
    """Keywords of the latest earlier user turn that has any, less those the question repeats
    (after "How are uploads retried?", "and?", a "why?" follows up on the first)."""
    for message in reversed(history):
        terms = keywords(message.content) if message.role == "user" else []
        if terms:
            return [w for w in dict.fromkeys(terms) if w not in words][:8]
    return []


# Offline grading: coverage of the question's keywords mapped onto the grade scale. A
# strength of _WEAK_COVERAGE scores 0.0, _STRONG_COVERAGE scores 1.0 (linear between).
_WHOLE_WEIGHT = 0.6
_WEAK_COVERAGE = 0.25
_STRONG_COVERAGE = 0.7
_PASSAGE_LINES = 4


def _best_passage(question_words: Sequence[str], text: str) -> float:
    """The best coverage of ``question_words`` by any few consecutive non-blank lines."""
    lines = [line for line in text.splitlines() if line.strip()]
    best = 0.0
    for start in range(max(len(lines) - _PASSAGE_LINES + 1, 1)):
        best = max(best, overlap(question_words, " ".join(lines[start : start + _PASSAGE_LINES])))
        if best >= 1.0:
            break
    return best


def _signature(tool: str, args: dict[str, Any]) -> str:
    return tool + json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


def _max_length(tool: Tool | None, param: str | None, default: int = 2000) -> int:
    if tool is None:
        return default
    return next((p.max_length for p in tool.params if p.name == param), default)


@frozen
class _Parts:
    """The tools the rules below plan with, found by what their records say they do."""

    search: Tool | None  # the question's own search (vector_search)
    terms: Tool | None  # a term as written (grep_search)
    reader: Tool | None  # lines of a file (read_file)

    @classmethod
    def of(cls, tools: Sequence[Tool]) -> _Parts:
        return cls(
            next((t for t in tools if t.searches_question), None),
            next((t for t in tools if t.searches is Searches.TERMS), None),
            next((t for t in tools if t.path_arg is not None), None),
        )

    @staticmethod
    def name(tool: Tool | None) -> str | None:
        return tool.name if tool is not None else None


def _question_values(tool: Tool, question: str) -> list[dict[str, Any]]:
    """Arguments for ``tool`` found in the question: one per value of its ``question_arg``,
    or what its ``from_question`` builds (the searches and the file reader are planned by
    their own rules)."""
    qa = tool.question_arg
    if qa is not None:
        return [{qa.param: value} for value in qa.find(question)]
    if tool.searches is not None or tool.path_arg is not None or tool.from_question is None:
        return []
    args = tool.from_question(question)
    return [dict(args)] if args else []


class OfflineChatModel:
    """The ``ChatModel`` port answered by rules from each request's task; no network."""

    model = "offline"
    fits_any_prompt = True  # it sends no prompt anywhere: no context window to fit (Agent reads it)

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()

    def complete(
        self, request: LLMRequest, on_delta: Callable[[str], None] | None = None
    ) -> Completion:
        started = time.perf_counter()
        text = self.reply(request)
        if on_delta is not None and text:
            on_delta(text)
        latency_ms = (time.perf_counter() - started) * 1000.0
        return Completion(text, model=self.model, latency_ms=latency_ms, billable=False)

    def reply(self, request: LLMRequest) -> str:
        """The reply text for one request, made from its task."""
        task = request.task
        if isinstance(task, AnalyzeTask):
            return self.route(task)
        if isinstance(task, PlanTask):
            return self.plan(task)
        if isinstance(task, GradeTask):
            return self.grade(task)
        if isinstance(task, SynthesizeTask):
            return self.synthesize(task)
        raise LLMError(
            f"the offline backend cannot answer node {request.node} ({type(task).__name__})",
            node=request.node,
        )

    # -- analyze_and_route -------------------------------------------------------------

    def route(self, task: AnalyzeTask) -> str:
        question = task.question
        available = set(task.available_tools)
        identifiers = prompts.find_identifiers(question)
        paths = prompts.find_paths(question)
        named_in_question = [t.name for t in task.tools if _question_values(t, question)]
        if is_small_talk(question) and not task.previous_attempts:
            return json.dumps({"complexity": "chitchat", "suggested_tools": []})
        words = len(question.split())
        named = bool(identifiers or paths or named_in_question or prompts.find_jira_keys(question)
                     or prompts.find_confluence_page_ids(question) or prompts.find_urls(question))
        if _COMPLEX_MARKER.search(question) or words > 25:
            complexity = "complex"
        elif named or (_FACT_QUESTION.match(question) and words <= 12):
            complexity = "simple"
        else:
            complexity = "complex"
        parts = _Parts.of(task.tools)
        search, terms, reader = _Parts.name(parts.search), _Parts.name(parts.terms), _Parts.name(parts.reader)
        tools = [search]
        if identifiers or complexity == "complex":
            tools.append(terms)
        if paths:
            tools.append(reader)
        tools.extend(named_in_question)
        if task.previous_attempts:  # a re-retrieval widens the strategy
            tools.extend((terms, reader))
        suggested = [t for t in dict.fromkeys(tools) if t in available]
        return json.dumps({"complexity": complexity, "suggested_tools": suggested})

    # -- plan ----------------------------------------------------------------------------

    def plan(self, task: PlanTask) -> str:
        question = task.question
        allowed = [t for t in task.routing_plan.suggested_tools if t in task.available_tools]
        tried = {_signature(run.call.tool, dict(run.call.args)) for run in task.previous_attempts}
        rounds = len({run.round for run in task.previous_attempts})
        refining = bool(task.previous_attempts or task.evidence)
        top_k = max(1, min(task.top_k, MAX_TOP_K))
        calls: list[dict[str, Any]] = []
        planned: set[str] = set()
        records = {t.name: t for t in task.tools}
        parts = _Parts.of(task.tools)
        search = parts.search
        query_arg = search.query_arg if search is not None else None
        limit = _max_length(search, query_arg)
        whole = clip(question.strip(), limit)  # a very long question is searched by its beginning

        def add(tool: str | None, args: dict[str, Any]) -> bool:
            if tool is None or tool not in allowed or len(calls) >= prompts.MAX_CALLS:
                return False
            checked = args
            if tool in records:  # never plan what the strict plan checker would refuse
                try:
                    checked = check_args(records[tool], args, planned=True, question=question, top_k=top_k)
                except ArgumentError:
                    return False
            sig = _signature(tool, checked)  # as the calls already run were recorded: checked
            if sig in tried or sig in planned:
                return False
            planned.add(sig)
            calls.append({"tool": tool, "args": args})
            return True

        words = keywords(question)
        if search is not None and (search.name in allowed or not allowed):
            allowed = allowed or [search.name]
            queries = [whole]
            if refining:
                learnt = self._evidence_terms(task.evidence, task.previous_attempts, words)
                queries = [
                    clip(" ".join(words), limit) or whole,
                    clip(" ".join([*words, *learnt]), limit) or whole,
                    whole,
                ]
            sizes = [top_k] if not refining else [min(MAX_TOP_K, top_k * (rounds + 1)), MAX_TOP_K]
            for size in sizes:
                if any(add(search.name, {query_arg: q, "top_k": size}) for q in queries if q):
                    break
            context = _follow_up_terms(task.history, words)
            if context and not refining:  # a follow-up is also searched with what it follows up on
                add(search.name, {query_arg: clip(" ".join([*words, *context]), limit), "top_k": top_k})
        identifiers = prompts.find_identifiers(question)
        terms = parts.terms
        term_added = 0
        if terms is not None:
            for ident in identifiers[:3]:
                term_added += add(terms.name, {terms.query_arg: ident})
            if refining and not term_added:  # a term search wants words as written, not stems
                literal = set(split_words(question))
                literal = {w for w in literal if len(w) >= 5 and w.isascii() and w not in STOPWORDS}
                for word in sorted(literal, key=lambda w: (-len(w), w)):
                    if add(terms.name, {terms.query_arg: word}):
                        break
        reader = parts.reader
        if reader is not None:
            for path in prompts.find_paths(question)[:2]:
                add(reader.name, {reader.path_arg: path})
            if refining:
                searched = set(search_tools(task.tools))
                best = self._best_located(task.evidence, task.previous_attempts, words, searched)
                if best is not None and best.start_line is not None:
                    # Around the best item, in the place read_file takes: a PDF's page and its lines.
                    place = location(best.source, best.start_line, best.end_line or best.start_line)
                    args = {reader.path_arg: best.source, "start_line": max(1, place["start_line"] - 15),
                            "end_line": (place["end_line"] if "end_page" not in place else place["start_line"]) + 30}
                    if "page" in place and any(param.name == "page" for param in reader.params):
                        args["page"] = place["page"]
                    add(reader.name, args)
        for tool in task.tools:  # remote tools and your own: arguments from the question
            for args in _question_values(tool, question)[:2]:
                add(tool.name, args)
        widest = question_search(task.tools, whole, MAX_TOP_K) if not calls else None
        if widest is not None:  # everything was tried: search as widely as allowed
            calls.append({"tool": widest.tool, "args": dict(widest.args)})
        return json.dumps({"tool_calls": calls}, ensure_ascii=False)

    @staticmethod
    def _all_items(evidence: Sequence[EvidenceItem], attempts: Sequence[ToolRun]) -> list[EvidenceItem]:
        items = list(evidence)
        seen = {i.key for i in items}
        for run in attempts:
            for item in run.items:
                if item.key not in seen:
                    seen.add(item.key)
                    items.append(item)
        return items

    def _evidence_terms(
        self, evidence: Sequence[EvidenceItem], attempts: Sequence[ToolRun], words: Sequence[str]
    ) -> list[str]:
        """Up to three frequent content words of the evidence that the question lacks."""
        counts: Counter[str] = Counter()
        for item in self._all_items(evidence, attempts)[:20]:
            counts.update(w for w in keywords(item.text) if w.isascii() and len(w) >= 4)
        known = set(words)
        ranked = sorted(((-n, w) for w, n in counts.items() if w not in known and not w.isdigit()))
        return [w for _, w in ranked[:3]]

    def _best_located(
        self, evidence: Sequence[EvidenceItem], attempts: Sequence[ToolRun], words: Sequence[str],
        searched: set[str],
    ) -> EvidenceItem | None:
        """The item a search found (with a path and lines) whose text best matches the question."""
        best, best_score = None, 0.0
        for item in self._all_items(evidence, attempts):
            if item.tool not in searched or item.start_line is None:
                continue
            score = overlap(words, item.text) + (item.score or 0.0) * 0.1
            if score > best_score:
                best, best_score = item, score
        return best

    # -- grade_evidence ------------------------------------------------------------------

    def grade(self, task: GradeTask) -> str:
        return json.dumps([self.score(task.question, item) for item in task.items])

    @staticmethod
    def score(question: str, item: EvidenceItem) -> float:
        """Relevance of one item, 0..1, from how much of the question it covers.

        Two coverages of the question's keywords: by the whole item (its text, heading and
        path) and by its best passage of a few consecutive lines (an answer sits in one
        place, not scattered over a page). An item covering about two thirds of the question
        in one passage scores 0.7 or more ("answers it"); one covering a quarter or less
        scores below 0.3 and is dropped. Lines ``read_file`` read are graded the same way
        (reading a file the question names is approved by the ``read_file`` rule before any
        grading). The tool's own score is not used: hash-embedder cosines sit near 0.3 for
        relevant and unrelated chunks alike (docs/benchmarks.md).
        """
        words = keywords(question)
        if not words:
            return 0.5
        whole = overlap(words, f"{item.text} {item.title} {item.source}")
        strength = _WHOLE_WEIGHT * whole + (1 - _WHOLE_WEIGHT) * _best_passage(words, item.text)
        value = (strength - _WEAK_COVERAGE) / (_STRONG_COVERAGE - _WEAK_COVERAGE)
        return round(min(max(value, 0.0), 1.0), 3)

    # -- synthesize ----------------------------------------------------------------------

    def synthesize(self, task: SynthesizeTask) -> str:
        if task.chitchat or not task.items:
            return self._chat(task.question)
        words = keywords(task.question)
        candidates: list[tuple[float, int, int, str]] = []  # (-score, item index, position, quote)
        files = FileLines()
        leads = [opening_fence(item, files) for item in task.items]
        for k, item in enumerate(task.items):
            quotes = code_quotes(item.text, words) if code_file(item) else item_quotes(item, task.question, leads[k])
            for pos, quote in quotes:
                vocabulary = set(keywords(quote))
                hits = sum(1 for w in words if in_vocabulary(w, vocabulary))
                if quote.startswith(("```", "~~~")):
                    hits = hits - 0.5 if hits >= 2 else 0  # code: only when it names the subject
                elif quote.startswith("|") and table_excerpt(quote, item.text):
                    hits -= 0.25  # rows of a table, each holding some of the words: after a sentence holding as many
                if hits > 0:
                    candidates.append((-(hits + (item.score or 0.0) * 0.1), k, pos, quote))
        chosen: list[tuple[int, int, str]] = []
        per_item: Counter[int] = Counter()
        quoted: set[str] = set()
        code_blocks = 0
        for _, k, pos, quote in sorted(candidates):
            if len(chosen) >= _MAX_QUOTES:
                break
            is_code = quote.startswith(("```", "~~~"))
            said = words_of(quote)
            if per_item[k] >= _PER_ITEM or any(same_text(said, q) for q in quoted) or (is_code and code_blocks):
                continue  # overlapping items (or a document quoting another) repeat text
            per_item[k] += 1
            code_blocks += is_code
            quoted.add(said)
            chosen.append((k, pos, quote))
        if not chosen:  # nothing matches a keyword: quote the opening of the first items
            for k, item in enumerate(task.items[:2]):
                if code_file(item):
                    continue  # its lines are quoted as code or not at all
                quotes = item_quotes(item, lead=leads[k])
                first = next((q for q in quotes if not q[1].startswith(("```", "~~~"))), None)
                if first:
                    chosen.append((k, first[0], first[1]))
        lines = [OFFLINE_PREFACE, ""]
        for k, _, quote in sorted(chosen):
            if quote.startswith(("```", "~~~", "|")):  # a code block or a table: its marker below it
                if lines[-1]:
                    lines.append("")
                lines.extend([quote, f"[{k + 1}]", ""])
            else:
                lines.append(f"- {quote} [{k + 1}]")
        if not chosen:
            markers = "".join(f"[{k}]" for k in range(1, min(len(task.items), 3) + 1))
            lines.append(f"{NO_QUOTABLE[:-1]} {markers}.")  # crag's own sentence: never judged
        return "\n".join(lines).rstrip()

    @staticmethod
    def _chat(question: str) -> str:
        if _THANKS.search(question):
            return "You're welcome! Ask me anything else about your documents."
        if _BYE.search(question):
            return "Goodbye! Come back any time you have a question about your documents."
        if _ABOUT_ME.search(question):
            return (
                "I'm crag: I answer questions from your knowledge base and cite the file and line of "
                "each passage I use. I'm running offline right now, so answers are quoted from your "
                "documents rather than written by an LLM. What would you like to know?"
            )
        return (
            "Hello! I answer questions from your knowledge base, quoting the passages I find with "
            "citations (running offline: no LLM is used). What would you like to know?"
        )
