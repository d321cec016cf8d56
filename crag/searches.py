"""Retrieval the planner cannot make worse: what runs besides, and instead of, planned calls.

Theory of operation. The planner (an LLM, sometimes a small one) decides what to look for;
these pure rules make sure its choices can only add to what a plain search for the question
finds (see ``docs/real-models.md``). They read what they need of a tool from its record
(``crag.toolspec.Tool``: ``searches``, ``paging``, ``same_search``, ``match_cap``,
``path_arg``), never its name:

* ``with_question_search``: the first round always runs the question's own search (the tool
  that ``searches_question``, ``vector_search``: the user's question with ``top_k`` =
  ``KB_AGENT_TOP_K``), once, besides the planned calls (after them, so the planner's
  targeted finds keep the first numbers). The one exception: when every planned call reads
  a file (``path_arg``) whose path the question itself names (as written, spelt another way
  such as ``docs//setup.md``, or with the folders above it: ``docs/setup.md`` read as
  ``kb/docs/setup.md``), the user pointed at the source and only those reads run; when one of them finds nothing (lines the planner chose past
  the file's end), the question's search runs after them (``ToolRequest.fallback``, made
  by ``tool_exec``) rather than the answer having no evidence.
* ``deepen_repeats``: a planned call identical to one already run for this question (the
  tool's ``same_search``; ``top_k`` aside) would only bring the same evidence again. A tool
  with ``paging`` makes it the same search one page deeper: ``Paging.DEEPER`` asks for
  ``top_k`` more hits (``vector_search``), ``Paging.AGAIN`` keeps its arguments
  (``grep_search``), and ``tool_exec`` keeps only what earlier runs of that search did not
  return (``unseen``). Any other repeated call is dropped. Audited as ``call_repeated``.
* ``searched_question``: what the question's own search looks for. A follow-up with no word
  of its own to search ("and?", "why?", "more", "tell me more", "go on", "what about the second
  one?") is read with the conversation's latest earlier user question that has one: ``How are
  uploads retried? why?``. Any other question is searched as it is.
* ``cap_matches``: a tool with a ``match_cap`` (``grep_search``: 2) keeps at most
  ``match_cap`` x ``KB_AGENT_TOP_K`` results, the files with the most matches first (in
  their order of discovery on ties), lines in file order within a file; when there were
  more, ``grep_truncated`` says how many.
* ``retrieval_rank``: evidence no grader has scored, best first, for a prompt that cannot
  hold all of it: each call's first hit, then each call's second, and so on (context order
  on ties). Ranked in context order instead, one call's many hits (a grep for a common word)
  left out every hit of the calls after it, the question's own search among them.
* ``joined``: the answer's evidence with the windows of one file that share lines made one
  item (a grep match's window, the search's chunk around it and the next match's window
  showed the same sentences two or three times, and a small model answered from the
  sentence it read most often rather than the one that answers; docs/real-models.md).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from typing import Any

from attrs import evolve

from . import prompts
from .state import AuditEvent, EvidenceItem, Message, ToolCall, ToolRun
from .text import keywords, stem
from .toolspec import MAX_TOP_K, Paging, Tool, question_search  # MAX_TOP_K: the most hits one search returns

__all__ = [
    "MAX_TOP_K",
    "cap_matches",
    "deepen_repeats",
    "is_small_talk",
    "retrieval_rank",
    "same_query",
    "searched_question",
    "signature",
    "unseen",
    "with_question_search",
]


# Words (as ``keywords`` stems them) that ask for more of the same rather than name a subject,
# or point back at something the earlier turn named ("what about the second one?").
FOLLOW_UP_WORDS = frozenset({"go", "continue", "elaborate", "detail", "expand", "clarify", "really", "ok", "okay",
                             "sure", "example", "say", "first", "second", "third", "last", "next", "previous",
                             "former", "latter", "another"})
# Words that carry no content in small talk ("thanks, that helped a lot!").
_SMALL_TALK = frozenset(
    """
    hi hello hey hiya howdy yo greetings morning afternoon evening day night good thanks thank
    thx ty cheers bye goodbye see ya later ok okay cool great nice awesome perfect wonderful
    excellent fine got it helped helpful help lot much so very again there everyone all friend
    mate buddy bot assistant crag how are you doing going up whats sup who what can do today
    appreciate appreciated job well done welcome sure alright right hola bonjour merci danke hallo ciao gracias
    """.split()
)
_SMALL_TALK_STEMS = _SMALL_TALK | {stem(w) for w in _SMALL_TALK}
_GREETING = re.compile(
    r"^\s*(?:hi|hello|hey|hiya|howdy|yo|greetings|good\s+(?:morning|afternoon|evening|day|night)|"
    r"thanks|thank\s+you|thx|ty|cheers|bye|goodbye|see\s+(?:you|ya)|ok|okay|cool|great|nice|awesome|"
    r"perfect|got\s+it|how\s+are\s+you|how's\s+it\s+going|what's\s+up|whats\s+up|sup|who\s+are\s+you|"
    r"what\s+are\s+you|what\s+can\s+you\s+do|你好|您好|谢谢|多谢|再见|hola|bonjour|merci|danke|hallo|ciao|gracias)\b",
    re.I,
)
_GREETING_CJK = re.compile(r"^\s*(?:你好|您好|谢谢|多谢|再见|早上好|晚上好)[\s!！。.~～]*$")


def is_small_talk(text: str) -> bool:
    """Whether ``text`` is a greeting, a thank-you or other small talk that names nothing to
    search ("thanks, that helped a lot!", "hello there", "谢谢"): what the offline backend routes
    ``chitchat``, and a turn a follow-up is not read with."""
    if _GREETING_CJK.match(text):
        return True
    if not _GREETING.match(text):
        return False
    if prompts.find_identifiers(text) or prompts.find_paths(text) or prompts.find_urls(text):
        return False
    if prompts.find_jira_keys(text):
        return False
    return not [w for w in keywords(text) if w not in _SMALL_TALK_STEMS]


# Words of thanks and praise a turn can be made of without opening with a greeting
# ("Excellent, thank you!", "much appreciated", "helpful, thanks").
_THANKS_WORDS = frozenset(keywords(
    "thanks thank thx ty cheers excellent great nice awesome perfect wonderful cool alright appreciate "
    "appreciated helpful much lot"
))


def _thanks(text: str) -> bool:
    """Whether ``text`` is only words of thanks or praise (with ``FOLLOW_UP_WORDS``)."""
    said = keywords(text)
    return bool(said) and all(w in _THANKS_WORDS or w in FOLLOW_UP_WORDS for w in said)


def searched_question(question: str, history: Sequence[Message]) -> str:
    """``question``, or, when it names nothing to search (``keywords`` finds no word beyond
    ``FOLLOW_UP_WORDS``), the latest earlier user turn that does (small talk names nothing),
    followed by ``question``."""
    if any(w not in FOLLOW_UP_WORDS for w in keywords(question)):
        return question
    for message in reversed(history):
        if message.role != "user" or is_small_talk(message.content) or _thanks(message.content):
            continue
        if any(w not in FOLLOW_UP_WORDS for w in keywords(message.content)):
            return f"{message.content.strip()} {question.strip()}"
    return question


def same_query(a: str, b: str) -> bool:
    """Two queries are the same search when they differ only in case and spacing."""
    return " ".join(str(a).split()).casefold() == " ".join(str(b).split()).casefold()


def _records(tools: Sequence[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


def signature(call: ToolCall, tool: Tool | None) -> tuple[Any, ...]:
    """What makes two calls the same search: the tool's ``same_search``, else every argument
    but ``top_k``."""
    if tool is not None and tool.same_search is not None:
        return (call.tool, tool.same_search(call.args))
    return (call.tool, tuple(sorted((str(k), repr(v)) for k, v in call.args.items() if k != "top_k")))


def with_question_search(
    calls: Sequence[ToolCall], question: str, top_k: int, named_paths: Sequence[str], tools: Sequence[Tool]
) -> tuple[tuple[ToolCall, ...], tuple[AuditEvent, ...]]:
    """The first round's calls: the planned ones, then the question's own search."""
    calls = tuple(calls)
    own_search = question_search(tools, question.strip() or question, top_k)
    if own_search is None:
        return calls, ()
    records = _records(tools)
    named = [_spelt(p) for p in named_paths]

    def reads_named_file(call: ToolCall) -> bool:
        arg = records[call.tool].path_arg if call.tool in records else None
        return arg is not None and any(_same_file(_spelt(str(call.args.get(arg, ""))), p) for p in named)

    if calls and named and all(reads_named_file(c) for c in calls):
        return calls, ()
    searcher = records[own_search.tool]
    query_arg = searcher.query_arg or ""
    query = own_search.args.get(query_arg, question)  # a long question's beginning
    own = [c for c in calls if c.tool == searcher.name and same_query(c.args.get(query_arg, ""), query)]
    if own:  # the planner asked for it too: run it once, with at least top_k hits
        first = own[0]
        k = max(int(first.args.get("top_k", top_k)), top_k)
        kept = tuple(c for c in calls if c is first or c not in own)
        return tuple(ToolCall(c.tool, {**c.args, "top_k": k}) if c is first else c for c in kept), ()
    event = AuditEvent("question_searched", {"query": str(query).strip(), "top_k": top_k})
    return (*calls, own_search), (event,)


def _spelt(path: str) -> str:
    """``path`` as one spelling of it (``docs//setup.md``, ``./docs/./setup.md`` and
    ``docs/setup.md/`` are ``docs/setup.md``); empty stays empty."""
    return posixpath.normpath(path) if path else ""


def _same_file(read: str, named: str) -> bool:
    """Whether a read of ``read`` reads the file the question names as ``named``: the same path,
    or one of them the other with folders in front (``kb/docs/setup.md`` and ``docs/setup.md``,
    the path from the working directory and the path in its root, or an absolute path)."""
    if not read or not named:
        return False
    longer, shorter = (read, named) if len(read) >= len(named) else (named, read)
    return longer == shorter or longer.endswith("/" + shorter)


def deepen_repeats(
    calls: Sequence[ToolCall], history: Sequence[ToolRun], top_k: int, question: str, tools: Sequence[Tool],
    *, fall_back: bool = True,
) -> tuple[tuple[ToolCall, ...], tuple[AuditEvent, ...]]:
    """Calls identical to earlier ones made one page deeper (or dropped); see the module doc.

    When none is left, the question's own search one page deeper (``fall_back``); when that
    search has returned its last page too, no call at all."""
    records = _records(tools)

    def paging(call: ToolCall) -> Paging | None:
        record = records.get(call.tool)
        return record.paging if record is not None else None

    earlier: dict[tuple[Any, ...], int] = {}
    for run in history:
        if run.error is None:
            key = signature(run.call, records.get(run.call.tool))
            k = int(run.call.args.get("top_k", top_k) or top_k) if paging(run.call) is Paging.DEEPER else 0
            earlier[key] = max(earlier.get(key, 0), k)
    out: list[ToolCall] = []
    audit: list[AuditEvent] = []
    seen: set[tuple[Any, ...]] = set()
    for call in calls:
        key = signature(call, records.get(call.tool))
        if key in seen:
            continue
        seen.add(key)
        if key not in earlier:
            out.append(call)
            continue
        pages = paging(call)
        if pages is Paging.DEEPER and earlier[key] < MAX_TOP_K:
            deeper = min(MAX_TOP_K, earlier[key] + max(int(call.args.get("top_k", top_k)), top_k))
            out.append(ToolCall(call.tool, {**call.args, "top_k": deeper}))
            audit.append(AuditEvent("call_repeated", {"tool": call.tool, "action": "next page", "top_k": deeper}))
        elif pages is Paging.AGAIN:
            out.append(call)
            audit.append(AuditEvent("call_repeated", {"tool": call.tool, "action": "next page"}))
        else:
            audit.append(AuditEvent("call_repeated", {"tool": call.tool, "action": "dropped"}))
    if not out and fall_back:
        fallback = question_search(tools, question.strip() or question, top_k)
        if fallback is None:
            return (), tuple(audit)
        if signature(fallback, records.get(fallback.tool)) in earlier:
            deeper, more = deepen_repeats((fallback,), history, top_k, question, tools, fall_back=False)
            return deeper, (*audit, *more)
        out.append(fallback)
    return tuple(out), tuple(audit)


def unseen(
    call: ToolCall, items: Sequence[EvidenceItem], history: Sequence[ToolRun], tool: Tool | None
) -> tuple[EvidenceItem, ...]:
    """``items`` without those an earlier run of the same search already returned (a tool
    with ``paging``; any other keeps all)."""
    if tool is None or tool.paging is None:
        return tuple(items)
    key = signature(call, tool)
    returned = {i.key for run in history if run.call.tool == call.tool and signature(run.call, tool) == key
                for i in run.items}
    if not returned:
        return tuple(items)
    return tuple(i for i in items if i.key not in returned)


def cap_matches(items: Sequence[EvidenceItem], cap: int) -> tuple[tuple[EvidenceItem, ...], int]:
    """At most ``cap`` matches, best files first, and how many were left out."""
    items = tuple(items)
    if len(items) <= cap:
        return items, 0
    counts: dict[str, int] = {}
    for item in items:
        counts[item.source] = counts.get(item.source, 0) + 1
    order = {source: n for n, source in enumerate(counts)}
    ranked = sorted(items, key=lambda i: (-counts[i.source], order[i.source]))
    return tuple(ranked[:cap]), len(items) - cap


def retrieval_rank(context: Sequence[EvidenceItem], history: Sequence[ToolRun]) -> list[int]:
    """Indexes of ``context`` best first by where each item stands in the run that returned
    it (its first hit, then its second ...), ties in context order."""
    where: dict[tuple, int] = {}
    for run in history:
        for n, item in enumerate(run.items):
            where[item.key] = min(n, where.get(item.key, n))
    return sorted(range(len(context)), key=lambda i: (where.get(context[i].key, len(context)), i))


def _lines(item: EvidenceItem) -> list[str] | None:
    """``item``'s text a line per line of its span, or None when it has no span or its text
    does not map onto one (a page, a remote item)."""
    if item.start_line is None or item.end_line is None:
        return None
    lines = item.text.split("\n")
    return lines if len(lines) == item.end_line - item.start_line + 1 else None


def joined(items: Sequence[EvidenceItem], limit: int) -> tuple[tuple[EvidenceItem, ...], tuple[tuple[int, ...], ...]]:
    """``items`` with each item whose lines overlap an earlier item's of the same source
    joined to it: one item spanning both (first line of the first to last of the last, the
    earlier item's tool, anchor and place in the list, the better score), its text each
    line once; a joined item that comes to overlap another is joined to it in turn. Windows
    that only touch stay apart (chunks of one file are cut without overlap: joined, a file
    would become one item), and so do windows whose union would be longer than ``limit``
    characters (a prompt quotes at most that much of an item) or whose shared lines differ.
    Returns the items and, for each, the indexes of ``items`` it holds."""
    out: list[EvidenceItem] = []
    members: list[list[int]] = []
    spans: list[dict[int, str] | None] = []

    def union(j: int, item: EvidenceItem, mine: dict[int, str]) -> dict[int, str] | None:
        held = spans[j]
        if held is None or out[j].source != item.source:
            return None
        shared = mine.keys() & held.keys()
        if not shared or any(mine[n] != held[n] for n in shared):
            return None
        both = held | mine
        return both if sum(len(line) + 1 for line in both.values()) - 1 <= limit else None

    for k, item in enumerate(items):
        lines = _lines(item)
        out.append(item)
        members.append([k])
        spans.append(None if lines is None else dict(enumerate(lines, item.start_line)))
        j = len(out) - 1
        while spans[j] is not None:  # join the newest item to the first it overlaps, again while it grows
            mine = spans[j]
            into = next(((i, both) for i in range(len(out)) if i != j and (both := union(i, out[j], mine))), None)
            if into is None:
                break
            i, both = into
            first, last = (i, j) if i < j else (j, i)
            scores = [s for s in (out[i].score, out[j].score) if s is not None]
            out[first] = evolve(out[first], text="\n".join(both[n] for n in sorted(both)), start_line=min(both),
                                end_line=max(both), score=max(scores) if scores else None)
            spans[first] = both
            members[first] = sorted(members[i] + members[j])
            del out[last], members[last], spans[last]
            j = first
    return tuple(out), tuple(tuple(m) for m in members)
