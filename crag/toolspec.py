"""The tool record: everything crag knows about one tool, in one place. Pure, no I/O.

A ``Tool`` says what the planner is told (``description``, ``params``, ``advice``), how
its arguments are checked (``params``, ``check``), when it may run (``enabled`` by the
settings; with ``question_arg``, only with an argument written in the user's question),
and what runs it (``run``). The built-in tools each define theirs in their own module
under ``crag/tools/``; ``crag.tools.BUILTIN_TOOLS`` is the registry the toolbox reads, and
the nodes receive the records of the tools on offer as data. A tool written in your own
program is a ``Tool`` too: pass it to ``Agent.from_env(tools=[...])`` (docs/architecture.md
walks through it).

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

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from attrs import field, frozen

from .state import EvidenceItem, ToolCall

__all__ = [
    "CONFIGURED_TOP_K",
    "ArgumentError",
    "Param",
    "QuestionArg",
    "Tool",
    "check_args",
    "planner_line",
    "question_search",
]

TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_TOP_K = 50  # the largest top_k any search takes


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
        raise ValueError(f"{attribute.name} must be one of {', '.join(_TYPES)}, not {value!r}")


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
    for refusals and prompts ("a Jira key (like ABC-123)").
    """

    param: str
    find: Callable[[str], Sequence[str]]
    what: str
    match: Callable[[Any, Sequence[str]], str | None] | None = None

    def designated(self, raw: Any, found: Sequence[str]) -> str | None:
        if self.match is not None:
            return self.match(raw, found)
        return raw if isinstance(raw, str) and raw in found else None


def _always(settings: Any) -> bool:
    return True


def _check_name(_: Any, attribute: Any, value: str) -> None:
    if not isinstance(value, str) or not TOOL_NAME.match(value):
        raise ValueError(f"a tool name is lower-case letters, digits and _, starting with a letter; not {value!r}")


@frozen
class Tool:
    """One tool (see the module docstring).

    ``run(args, toolbox)`` gets the checked arguments and the toolbox running it (for its
    ``settings``, ``label(path)``, ``http_timeout``...) and returns the evidence found; it
    raises ``crag.errors.ToolError`` when the call fails. ``from_question(question)`` builds
    arguments from the question alone, for a plan reply that only names the tool (None:
    it cannot). ``enabled(settings)`` says whether the settings turn it on, and
    ``enable_hint`` how to (``set JIRA_BASE_URL``).

    ``searches_question``: the tool searches the knowledge base for a text in words,
    ``from_question(text)`` and a ``top_k`` being such a search (``question_search``; used
    by ``Agent.search`` and ``crag search``).
    """

    name: str = field(validator=_check_name)
    description: str
    run: Callable[[dict[str, Any], Any], Iterable[EvidenceItem]]  # or a crag.ports.ToolResult
    params: tuple[Param, ...] = field(default=(), converter=tuple)
    check: Callable[[dict[str, Any]], None] | None = None
    question_arg: QuestionArg | None = None
    from_question: Callable[[str], Mapping[str, Any] | None] | None = None
    advice: str = ""
    enabled: Callable[[Any], bool] = _always
    enable_hint: str = ""
    searches_question: bool = False

    def __attrs_post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"tool {self.name} declares an argument twice")
        if self.question_arg is not None and self.question_arg.param not in names:
            raise ValueError(f"tool {self.name}: question_arg {self.question_arg.param!r} is not a parameter")
        if self.searches_question and self.from_question is None:
            raise ValueError(f"tool {self.name} searches the question but has no from_question")


def question_search(tools: Iterable[Tool], text: str, top_k: int) -> ToolCall | None:
    """The call that searches for ``text`` itself with ``top_k`` hits, by the first of ``tools``
    that ``searches_question``; None when none does."""
    for tool in tools:
        if tool.searches_question and tool.from_question is not None:
            args = dict(tool.from_question(text) or {})
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
            raise ArgumentError(tool, f"argument {param.name!r} must be an integer, got {value!r}")
        lo, hi = param.minimum, param.maximum
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
        if planned and param.clamp:
            return min(max(value, lo if lo is not None else value), hi if hi is not None else value)
        if lo is not None and hi is not None:
            raise ArgumentError(tool, f"argument {param.name!r} must be between {lo} and {hi}, got {value}")
        bound = f"at least {lo}" if lo is not None else f"at most {hi}"
        raise ArgumentError(tool, f"argument {param.name!r} must be {bound}, got {value}")
    # boolean
    if isinstance(value, bool):
        return value
    if not planned:
        if isinstance(value, str) and value.strip().lower() in (*_TRUE, *_FALSE):
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    raise ArgumentError(tool, f"argument {param.name!r} must be true or false, got {value!r}")
