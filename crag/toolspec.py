"""The tool record: everything crag knows about one tool, in one place. Pure, no I/O.

A ``Tool`` says what the planner is told (``description``, ``params``, ``advice``), how
its arguments are checked (``params``, ``check``), when it may run (``enabled`` by the
settings; with ``question_arg``, only with an argument written in the user's question),
and what runs it (``run``), and what the core may rely on when it plans around the planner
(``searches``, ``query_arg``, ``paging``, ``match_cap``, ``path_arg``, ``same_search``) and
when it grades (``reads_lines``, ``vector_scores``): see ``Tool``. The built-in tools each
define theirs in their own module under ``crag/tools/``; ``crag.tools.BUILTIN_TOOLS`` is the
registry the toolbox reads, and the nodes receive the records of the tools on offer as data.
A tool written in your own program is a ``Tool`` too: pass it to
``Agent.from_env(tools=[...])`` (docs/architecture.md walks through it).

Arguments are checked by ``check_args`` in one of two modes:

* ``planned=True``, a plan from the model: values must have their JSON types (``"5"`` is
  not an integer), unknown argument names are dropped, an integer outside its range is
  clamped when the parameter says ``clamp`` and refused otherwise, and a ``question_arg``
  must be one the question contains (it defaults to the first one found there);
* ``planned=False``, a direct call (``Toolbox.run``): unknown names are refused and
  unambiguous strings are read as what they spell (``"5"`` → 5, ``"true"`` → True).

Either way a refusal is an ``ArgumentError`` whose message names the tool and argument.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attrs import field, frozen

from .errors import UsageError
from .modes import MAX_TOP_K  # re-exported: the largest top_k any search takes
from .state import AuditEvent, EvidenceItem, ToolCall

if TYPE_CHECKING:
    from .config import Settings
    from .ports import Retriever

__all__ = [
    "CONFIGURED_TOP_K",
    "MAX_TOP_K",
    "ArgumentError",
    "Http",
    "Paging",
    "Param",
    "QuestionArg",
    "Searches",
    "Tool",
    "ToolContext",
    "ToolResult",
    "check_args",
    "clip",
    "planner_line",
    "question_search",
    "search_tools",
]

TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class ArgumentError(ValueError):
    """Arguments a tool cannot run with; the message says which and why."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.reason = message


class _ConfiguredTopK:
    """Default of a ``top_k`` parameter: the ``KB_AGENT_TOP_K`` of the run."""

    def __repr__(self) -> str:
        return "CONFIGURED_TOP_K"


CONFIGURED_TOP_K: Any = _ConfiguredTopK()

_TYPES = ("string", "integer", "boolean")
_SHORT = {"string": "str", "integer": "int", "boolean": "bool"}


def _check_type(_: Any, attribute: Any, value: str) -> None:
    if value not in _TYPES:
        raise UsageError(f"{attribute.name} must be one of {', '.join(_TYPES)}, not {value!r}")


@frozen
class Param:
    """One argument: its JSON type, whether it is required, its default and its bounds.

    ``hint`` replaces what the planner is shown for its value (default: the type, its
    range, and ``(optional)``). In a plan, ``clamp`` brings an integer outside its range to
    the nearest bound, and ``floor_at_default`` raises one below the default to the default
    (a planner never gets fewer search hits than the user configured). A string holding a
    NUL character is refused unless ``nul_ok`` (free text such as a search query).
    """

    name: str
    type: str = field(default="string", validator=_check_type)
    required: bool = False
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int = 2000
    clamp: bool = False
    floor_at_default: bool = False
    nul_ok: bool = False
    hint: str = ""

    def describe(self) -> str:
        if self.hint:
            return self.hint
        text = _SHORT[self.type]
        if self.type == "integer" and self.minimum is not None and self.maximum is not None:
            text += f" {self.minimum}-{self.maximum}"
        if not self.required and self.default is None:
            text += " (optional)"
        return text


@frozen
class QuestionArg:
    """A remote tool's argument that must be written in the user's question.

    ``find(question)`` lists the values the question contains, in order; ``match(raw,
    found)`` returns the value of ``found`` that a model's ``raw`` argument designates, or
    None (default: ``raw`` itself when it is one of them). ``what`` names the kind of value
    for refusals and prompts ("a Jira key (like ABC-123)"). ``fetchable(value)``: whether the
    tool, once on, would fetch a value found (default: every one), so that a question naming
    only values it refuses is not told to turn it on.
    """

    param: str
    find: Callable[[str], Sequence[str]]
    what: str
    match: Callable[[Any, Sequence[str]], str | None] | None = None
    fetchable: Callable[[str], bool] | None = None

    def designated(self, raw: Any, found: Sequence[str]) -> str | None:
        if self.match is not None:
            return self.match(raw, found)
        return raw if isinstance(raw, str) and raw in found else None


@frozen
class ToolResult:
    """What a tool's ``run`` returns: the items it found, plus audit events about the call (a
    ``glob`` that matched no file and was dropped, for instance), and ``more``: how many further
    results it found and left out at a cap of its own (``grep_search`` past ``MAX_MATCHES``)."""

    items: tuple[EvidenceItem, ...] = field(default=(), converter=tuple)
    audit: tuple[AuditEvent, ...] = field(default=(), converter=tuple)
    more: int = field(default=0, converter=int)

    @classmethod
    def of(cls, result: ToolResult | Iterable[EvidenceItem]) -> ToolResult:
        """``result`` as a ``ToolResult``: itself, or a plain list of items (what a toolbox or a
        tool of your own may return) as ``ToolResult(items)``."""
        return result if isinstance(result, cls) else cls(tuple(result))

    def __iter__(self) -> Iterator[EvidenceItem]:  # reads like the plain list of items
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]


@frozen
class Http:
    """How a remote tool reaches the network: one request's ``timeout`` in seconds, which
    addresses it may connect to, and how host names resolve (None: public addresses only,
    the system resolver; ``crag.tools.http``)."""

    timeout: float = 20.0
    address_allowed: Callable[[Any], bool] | None = None
    resolver: Callable[[str, int], Sequence[str]] | None = None


@runtime_checkable
class ToolContext(Protocol):
    """What a tool's ``run`` receives besides its arguments: the least a tool needs, never
    the toolbox that runs it.

    ``settings`` is read-only configuration (a remote tool's address and credentials);
    ``file_roots()`` the folders file tools look in and ``search_roots()`` those an index
    search is restricted to (None: the whole index); ``retriever()`` the index opened for
    search, terms and scores its business; ``label(path)`` a path as an evidence item's
    ``source`` and citations carry it (relative to ``cwd`` when under it, the name unescaped:
    whoever shows it to a person escapes it, ``crag.safe_text.display_name``);
    ``cwd`` what relative paths are read against; ``index_dir`` the index folder, never
    read as a document; ``http`` how remote tools reach the network.
    """

    settings: Settings
    cwd: str
    index_dir: str
    http: Http

    def file_roots(self) -> tuple[str, ...]: ...

    def search_roots(self) -> tuple[str, ...] | None: ...

    def retriever(self) -> Retriever: ...

    def label(self, path: str) -> str: ...


class Searches(enum.StrEnum):
    """What a searching tool's ``query_arg`` holds."""

    QUESTION = "question"  # words, as a question is written: ranked passages; the question's own search
    TERMS = "terms"  # a term as written (an identifier, a setting name): the lines that hold it


class Paging(enum.StrEnum):
    """What a call identical to an earlier one of the same question becomes (see ``crag.searches``)."""

    DEEPER = "deeper"  # the same search with ``top_k`` more hits; only hits not returned before are kept
    AGAIN = "again"  # the same call; only results not returned before are kept


def _always(settings: Any) -> bool:
    return True


def _check_name(_: Any, attribute: Any, value: str) -> None:
    if not isinstance(value, str) or not TOOL_NAME.match(value):
        raise UsageError(f"a tool name is lower-case letters, digits and _, starting with a letter; not {value!r}")


@frozen
class Tool:
    """One tool (see the module docstring).

    ``run(args, context)`` gets the checked arguments and a ``ToolContext`` (roots, labels,
    the retriever, HTTP) and returns a ``ToolResult``; it raises ``crag.errors.ToolError``
    when the call fails. ``from_question(question)`` builds
    arguments from the question alone, for a plan reply that only names the tool (None:
    it cannot). ``enabled(settings)`` says whether the settings turn it on, and
    ``enable_hint`` how to (``set JIRA_BASE_URL``).

    What the core relies on, instead of a tool's name, when it plans around the planner:

    * ``searches``: the tool searches the knowledge base for what its ``query_arg`` holds;
      such tools are suggested when the router names none. ``Searches.QUESTION``: a
      question in words, so ``from_question(text)`` with a ``top_k`` is the search for
      ``text`` (``question_search``: the first round's search of the question, the plan
      when nothing else is left, ``Agent.search``). ``Searches.TERMS``: a term as written.
    * ``paging``: what a call identical to an earlier one becomes (``Paging``; None: it is
      dropped), and ``same_search(args)`` what makes two calls identical (default: all the
      arguments but ``top_k``).
    * ``match_cap``: at most ``match_cap`` x ``KB_AGENT_TOP_K`` results of a call are kept,
      the files with the most first (0: no cap).
    * ``path_arg``: the tool reads the file this argument names; a plan that only reads
      files the question names runs alone.
    * ``reads_lines``: the tool returns the lines its arguments name, not a ranking of
      passages; a round whose every call is such a tool is approved without a grading call
      (the seeds' fast-path rule ``read_file``).
    * ``vector_scores``: each item's ``score`` is the index's cosine-like score in [0, 1]; the
      seeds' fast-path rule ``high_vector_score`` reads the scores recorded for such items.
    """

    name: str = field(validator=_check_name)
    description: str
    run: Callable[[dict[str, Any], ToolContext], ToolResult]
    params: tuple[Param, ...] = field(default=(), converter=tuple)
    check: Callable[[dict[str, Any]], None] | None = None
    question_arg: QuestionArg | None = None
    from_question: Callable[[str], Mapping[str, Any] | None] | None = None
    advice: str = ""
    enabled: Callable[[Any], bool] = _always
    enable_hint: str = ""
    searches: Searches | None = None
    query_arg: str | None = None
    paging: Paging | None = None
    same_search: Callable[[Mapping[str, Any]], Hashable] | None = None
    match_cap: int = 0
    path_arg: str | None = None
    reads_lines: bool = False
    vector_scores: bool = False

    @property
    def searches_question(self) -> bool:
        return self.searches is Searches.QUESTION

    def __attrs_post_init__(self) -> None:
        # A record that cannot work is the program's mistake, said as it is made (crag.UsageError).
        if not callable(self.run):
            raise UsageError(f"tool {self.name}: run must be callable (args, context) -> evidence, "
                             f"not {type(self.run).__name__}")
        if not isinstance(self.description, str):
            raise UsageError(f"tool {self.name}: the description must be text (what the planner is told), "
                             f"not {type(self.description).__name__}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise UsageError(f"tool {self.name} declares an argument twice")
        if self.question_arg is not None and self.question_arg.param not in names:
            raise UsageError(f"tool {self.name}: question_arg {self.question_arg.param!r} is not a parameter")
        for arg in (self.query_arg, self.path_arg):
            if arg is not None and arg not in names:
                raise UsageError(f"tool {self.name}: {arg!r} is not a parameter")
        if self.searches is not None and self.query_arg is None:
            raise UsageError(f"tool {self.name} searches but names no query_arg")
        if self.searches_question and self.from_question is None:
            raise UsageError(f"tool {self.name} searches the question but has no from_question")
        if self.paging is Paging.DEEPER and "top_k" not in names:
            raise UsageError(f"tool {self.name} pages deeper but has no top_k")


def search_tools(tools: Iterable[Tool]) -> tuple[str, ...]:
    """The names of the tools that search the knowledge base, in order: the router's default."""
    return tuple(t.name for t in tools if t.searches is not None)


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a space when one is near the end."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).strip()


def question_search(tools: Iterable[Tool], text: str, top_k: int) -> ToolCall | None:
    """The call that searches for ``text`` itself with ``top_k`` hits, by the first of ``tools``
    that ``searches_question``; None when none does. A text longer than the tool's argument may
    be is searched by its beginning (a question may hold far more than a query)."""
    for tool in tools:
        if tool.searches_question and tool.from_question is not None:
            args = dict(tool.from_question(text) or {})
            for param in tool.params:
                value = args.get(param.name)
                if isinstance(value, str) and len(value) > param.max_length:
                    args[param.name] = clip(value, param.max_length)
            if any(p.name == "top_k" for p in tool.params):
                args["top_k"] = top_k
            return ToolCall(tool.name, args)
    return None


def planner_line(tool: Tool) -> str:
    """How the planner sees ``tool``: ``- name: description. args: {...}; only with ...``."""
    args = ", ".join(f'"{p.name}": {p.describe()}' for p in tool.params)
    line = f"- {tool.name}: {tool.description}. args: {{{args}}}"
    if tool.question_arg is not None:
        line += f"; only with {tool.question_arg.what} written in the question"
    return line


# --------------------------------------------------------------------------------------
# Checking arguments
# --------------------------------------------------------------------------------------

_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")


def check_args(
    tool: Tool,
    args: Any,
    *,
    planned: bool,
    question: str | None = None,
    top_k: int = 5,
) -> dict[str, Any]:
    """The arguments ``tool`` runs with, checked and normalised; raises ``ArgumentError``.

    Only declared arguments come back, in declaration order, with defaults filled in.
    ``question`` (for a planned call) is what a ``question_arg`` must be found in;
    ``top_k`` is the value of ``CONFIGURED_TOP_K`` defaults.
    """
    name = tool.name
    if not isinstance(args, Mapping):
        what = "a JSON object" if planned else "an object"
        raise ArgumentError(name, f"args must be {what}, got {type(args).__name__}")
    known = tuple(p.name for p in tool.params)
    if not planned:
        unknown = sorted(str(k) for k in args if k not in known)
        if unknown:
            raise ArgumentError(name, f"unknown argument(s) {', '.join(unknown)}; accepted: {', '.join(known)}")
    given = dict(args)
    qa = tool.question_arg
    if qa is not None and question is not None:
        found = tuple(qa.find(question))
        if not found:
            raise ArgumentError(name, f"needs {qa.what} in the question")
        raw = given.get(qa.param)
        if raw is None:
            given[qa.param] = found[0]
        else:
            value = qa.designated(raw, found)
            if value is None:
                raise ArgumentError(name, f"{qa.param} {raw!r} is not in the question")
            given[qa.param] = value
    out: dict[str, Any] = {}
    for param in tool.params:
        value = _value(name, param, given.get(param.name), planned)
        default = top_k if param.default is CONFIGURED_TOP_K else param.default
        if value is not None and planned and param.floor_at_default and default is not None:
            value = max(value, default)
        if value is None:
            if param.required and default is None:
                raise ArgumentError(name, f"argument {param.name!r} {_missing(param)}")
            if default is None:
                continue
            value = default
        out[param.name] = value
    if tool.check is not None:
        tool.check(out)
    if planned:
        try:
            json.dumps(out)
        except (TypeError, ValueError):
            raise ArgumentError(name, "arguments are not plain JSON") from None
    return out


def _missing(param: Param) -> str:
    return "must be a non-empty string" if param.type == "string" else "is missing"


def _value(tool: str, param: Param, value: Any, planned: bool) -> Any:
    """``value`` checked against ``param``; None when it is absent (or an empty string)."""
    if value is None:
        return None
    if param.type == "string":
        if not planned and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ArgumentError(tool, f"argument {param.name!r} must be a non-empty string")
        value = value.strip()
        if not value:
            if param.required:
                raise ArgumentError(tool, f"argument {param.name!r} must be a non-empty string")
            return None
        if len(value) > param.max_length:
            raise ArgumentError(tool, f"argument {param.name!r} is longer than {param.max_length} characters")
        if "\x00" in value and not param.nul_ok:
            raise ArgumentError(tool, f"argument {param.name!r} contains a NUL character")
        return value
    if param.type == "integer":
        if not planned:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentError(tool, f"argument {param.name!r} must be an integer, got {_shown(value)}")
        lo, hi = param.minimum, param.maximum
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
        if planned and param.clamp:
            return min(max(value, lo if lo is not None else value), hi if hi is not None else value)
        if lo is not None and hi is not None:
            raise ArgumentError(tool, f"argument {param.name!r} must be between {lo} and {hi}, got {_shown(value)}")
        bound = f"at least {lo}" if lo is not None else f"at most {hi}"
        raise ArgumentError(tool, f"argument {param.name!r} must be {bound}, got {_shown(value)}")
    # boolean
    if isinstance(value, bool):
        return value
    if not planned:
        if isinstance(value, str) and value.strip().lower() in (*_TRUE, *_FALSE):
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    raise ArgumentError(tool, f"argument {param.name!r} must be true or false, got {_shown(value)}")

SHOWN_CHARS = 40  # of a refused value in its error: a 300-digit start_line is not worth reading


def _shown(value: Any) -> str:
    """A refused value as its error shows it: an integer as written, anything else as its
    ``repr``; either cut to ``SHOWN_CHARS`` characters, saying how long it was."""
    try:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else repr(value)
    except ValueError:  # an integer of more digits than Python converts
        return "an integer of thousands of digits"
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[: SHOWN_CHARS - 3]}... ({len(text):,} characters)"
