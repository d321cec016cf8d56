"""gitignore patterns, compiled so that matching cannot backtrack (``crag.index.ignore``
reads the files).

A line is parsed the way git parses it (``gitignore(5)``: ``#`` comments, trailing spaces
unless escaped, ``!`` negation, a trailing ``/`` for folders only, a ``/`` elsewhere anchoring
the pattern to its folder), and each path component's glob follows git's ``wildmatch``: ``*``
and ``?`` never match ``/``, ``[...]`` classes with ranges, ``!``/``^`` negation and
``[:alpha:]``-style names, ``\\`` escapes, and a component that is only ``**`` matching any
number of folders. As in git, matching is over UTF-8 bytes, ``\\/`` is a slash, a class
may hold ``/`` (never matched), and a ``**`` right after the pattern's plain leading text
spans folders (git compares that text first and wildmatches the rest on its own).

Theory of operation. Matching is not a backtracking regular expression. A component's glob is
the fixed-length pieces between its stars: the first piece is tried at the start, the last at
the end, each middle one at its leftmost place after the one before (the classic greedy
wildcard match, at most length x pattern steps); ``**`` components are placed the same way over
the path's components. So no pattern and no file name can make matching slow. Within a
``RuleSet`` the last matching line decides; lines that are a plain name, ``*suffix``,
``prefix*`` or an anchored plain path are looked up in dictionaries, so a file of a hundred
thousand such lines costs a few lookups per path; the other lines are filed by what a path
must have to match them (a first folder, a last or first character), and only those that
can match are tried one by one, from the last back, stopping at the first match.

A line git would never match (``!`` alone, a trailing ``\\``, an unclosed ``[``, an unknown
``[:class:]``, a ``.`` or ``..`` folder as in ``./drafts``) is a ``Problem`` that skips it; an empty range (``[z-a]``) is a ``Problem`` that
keeps the line, whose range matches nothing, as in git.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from attrs import frozen

from .glob_classes import Dead as _Dead
from .glob_classes import parse_class as _parse_class

__all__ = ["Glob", "Problem", "Rule", "RuleSet", "parse_rules"]

# ---------------------------------------------------------------------------------------
# One path component's glob: fixed-length pieces between stars


# A piece is a run of single-character tokens: a str when they are all literal (matched with
# str methods), else a tuple of tokens (a literal character, None for ``?``, or a class).


def _piece_at(piece: str | tuple, text: str, i: int) -> bool:
    if isinstance(piece, str):
        return text.startswith(piece, i)
    for j, token in enumerate(piece):
        ch = text[i + j]
        if token is None:
            if ch == "/":
                return False
        elif isinstance(token, str):
            if ch != token:
                return False
        elif not token.matches(ch):
            return False
    return True


def _find_piece(piece: str | tuple, text: str, start: int, end: int) -> int:
    """The leftmost ``i`` in ``[start, end - len(piece)]`` where ``piece`` matches, else -1."""
    if isinstance(piece, str):
        return text.find(piece, start, end)
    for i in range(start, end - len(piece) + 1):
        if _piece_at(piece, text, i):
            return i
    return -1


@frozen
class Glob:
    """One path component's pattern: ``pieces[0] * pieces[1] * ... * pieces[-1]``."""

    pieces: tuple[str | tuple, ...]

    def matches(self, text: str) -> bool:
        pieces = self.pieces
        first = pieces[0]
        if len(pieces) == 1:
            return len(text) == len(first) and _piece_at(first, text, 0)
        last = pieces[-1]
        end = len(text) - len(last)
        if end < len(first) or not _piece_at(first, text, 0) or not _piece_at(last, text, end):
            return False
        pos = len(first)
        for piece in pieces[1:-1]:
            found = _find_piece(piece, text, pos, end)
            if found < 0:
                return False
            pos = found + len(piece)
        return True


GLOBSTAR = None  # a component that is only ``**``: any number of folders
_NO_NAMES = (Glob((".",)), Glob(("..",)))  # a component no path has: git never matches a line holding one


def _path_matches(segments: tuple[Glob | None, ...], parts: Sequence[str]) -> bool:
    """Whether the components ``parts`` match ``segments``, ``**`` placed greedily."""
    groups: list[list[Glob]] = [[]]
    for seg in segments:
        if seg is GLOBSTAR:
            groups.append([])
        else:
            groups[-1].append(seg)

    def at(group: list[Glob], i: int) -> bool:
        return all(g.matches(parts[i + k]) for k, g in enumerate(group))

    first = groups[0]
    if len(groups) == 1:
        return len(parts) == len(first) and at(first, 0)
    last = groups[-1]
    end = len(parts) - len(last)
    if end < len(first) or not at(first, 0) or not at(last, end):
        return False
    pos = len(first)
    for group in groups[1:-1]:
        for i in range(pos, end - len(group) + 1):
            if at(group, i):
                pos = i + len(group)
                break
        else:
            return False
    return True


# ---------------------------------------------------------------------------------------
# Parsing lines


def _glob(text: str, problems: list[str]) -> Glob:
    """One component (no ``/``) as a ``Glob``."""
    if "[" not in text and "?" not in text and "\\" not in text:
        return Glob(tuple(text.split("*")))  # literal pieces between stars: the common case
    pieces: list[list] = [[]]
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "*":
            pieces.append([])
        elif ch == "?":
            pieces[-1].append(None)
        elif ch == "[":
            cls, i = _parse_class(text, i, problems)
            pieces[-1].append(cls)
            continue
        elif ch == "\\":
            i += 1
            if i >= len(text):
                raise _Dead("it ends in an escaping backslash (write \\\\ for a backslash)")
            pieces[-1].append(text[i])
        else:
            pieces[-1].append(ch)
        i += 1
    return Glob(tuple("".join(p) if all(isinstance(t, str) for t in p) else tuple(p) for p in pieces))


def _split_components(pattern: str) -> list[str]:
    """``pattern`` split at its slashes, as git's wildmatch reads them: an escaped slash
    (``\\/``) is a slash too, and a slash inside a ``[...]`` class is a member of the class
    (which never matches a slash). ``_Dead`` for a class that is not closed."""
    if "\\" not in pattern and "[" not in pattern:
        return pattern.split("/")
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and not pattern.startswith("/", i + 1):
            current.append(pattern[i:i + 2])  # an escape, or a trailing backslash (said later)
            i += 2
            continue
        if ch == "[":  # an unclosed or unknown class: the whole line is dead, as in git
            end = _parse_class(pattern, i, [])[1]
            current.append(pattern[i:end])
            i = end
            continue
        if ch in "/\\":  # "/" or "\\/"
            parts.append("".join(current))
            current = []
            i += 2 if ch == "\\" else 1
            continue
        current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _trim_trailing_spaces(line: str) -> str:
    """Trailing spaces go unless escaped with a backslash, as git trims them."""
    end = len(line)
    while end and line[end - 1] == " ":
        backslashes = 0
        j = end - 2
        while j >= 0 and line[j] == "\\":
            backslashes += 1
            j -= 1
        if backslashes % 2:
            break
        end -= 1
    return line[:end]


@frozen
class Rule:
    """One ignore line, compiled."""

    line: int
    text: str
    negated: bool
    dir_only: bool
    anchored: bool  # matched against the whole path from its folder, else the last component
    segments: tuple[Glob | None, ...]


def _as_bytes(text: str) -> str:
    """``text`` as git's wildmatch sees it, one character per UTF-8 byte (so ``?`` is one
    byte and ``[é]`` a class of two bytes, as in git)."""
    if text.isascii():
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("latin-1")  # a name's undecodable bytes
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("latin-1")  # a lone surrogate in code's text


def _as_text(text: str) -> str:
    """The inverse of ``_as_bytes``, for messages."""
    return text if text.isascii() else text.encode("latin-1").decode("utf-8", "replace")


_SPECIAL = "*?[\\"


def _segments(parts: Sequence[str], anchored: bool, problems: list[str]) -> list[Glob | None]:
    segments: list[Glob | None] = []
    for part in parts:
        if anchored and part.startswith("**") and not part.strip("*"):
            segments.append(GLOBSTAR)
        else:
            segments.append(_glob(part, problems))
    if segments and segments[-1] is GLOBSTAR:
        # "dir/**" matches what is inside dir, not dir itself: one component at least.
        segments[-1:] = [Glob(("", "")), GLOBSTAR]
    return segments


def _spanning(pattern: str) -> tuple[list[str], str, str] | None:
    """Git's reading of a ``**`` that follows the pattern's plain leading text within a
    component (``docs**/x``, ``a/b**``): git compares that text first and matches the rest
    on its own, so the ``**`` starts the rest and spans folders (``docs**/x`` matches
    ``docsa/b/x`` and, the ``**/`` matching nothing, ``docsx``). (The plain folders before
    it, the plain text it follows, the rest of the pattern after its ``/``), or None."""
    start = next((i for i, ch in enumerate(pattern) if ch in _SPECIAL), len(pattern))
    if not pattern.startswith("**", start) or start == 0 or pattern[start - 1] == "/":
        return None
    end = start
    while pattern.startswith("*", end):
        end += 1
    rest = pattern[end:]
    if rest and not rest.startswith("/") and not rest.startswith("\\/"):
        return None
    *folders, text = pattern[:start].split("/")
    return folders, text, rest[2 if rest.startswith("\\") else 1:]


def _escaped_globstar(pattern: str) -> str:
    """``**\\/`` where git's ``**`` spans folders (a component's start, or right after the
    pattern's plain leading text): its escaped slash is a slash, but the ``**`` has no "match
    nothing" reading then, so it is one folder at least: ``*/**/``."""
    first = next((i for i, ch in enumerate(pattern) if ch in _SPECIAL), len(pattern))
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        end = i
        while pattern.startswith("*", end):
            end += 1
        spans = i == 0 or pattern[i - 1] == "/" or i == first
        if end - i >= 2 and pattern.startswith("\\/", end) and spans:
            out.append("*/**/")
            i = end + 2
            continue
        out.append(pattern[i:max(end, i + 1)])
        i = max(end, i + 1)
    return "".join(out)


def _spanning_segments(text: str, rest: str, problems: list[str]) -> list[list[Glob | None]]:
    """The alternatives of ``text**/rest`` (``text**`` when ``rest`` is empty)."""
    parts = _split_components(rest) if rest else []
    if "" in parts:
        raise _Dead("it holds an empty folder name (\"//\")")
    skip = 0
    while skip < len(parts) and parts[skip].startswith("**") and not parts[skip].strip("*"):
        skip += 1  # text**/**/rest reads as text**/rest
    parts = parts[skip:]
    if not parts:
        return [[Glob((text, "")), GLOBSTAR]]  # text, then anything: any number of folders
    across = [Glob((text, "")), GLOBSTAR, *_segments(parts, True, problems)]
    within = _segments([text + parts[0], *parts[1:]], True, problems)
    return [across, within]


def _rule(number: int, line: str, problems: list[str]) -> list[Rule]:
    """The rules of one line (two when git's reading of it has two alternatives); none for a
    blank line or a comment; ``_Dead`` when git would never match it."""
    line = _as_bytes(line)
    text = _trim_trailing_spaces(line) if line.endswith(" ") else line
    if not text or text[0] == "#":
        return []
    pattern = text
    negated = pattern.startswith("!")
    if negated:
        pattern = pattern[1:]
        if not pattern:
            raise _Dead("a \"!\" alone negates no pattern")
    dir_only = pattern.endswith("/")  # even after a backslash, as git reads it: "a\\/" is "a\\"
    if dir_only:
        pattern = pattern[:-1]
    anchored = "/" in pattern  # a slash anywhere, even in a class, anchors it, as in git
    if anchored and pattern.startswith("/"):
        pattern = pattern[1:]
    if not pattern:
        raise _Dead("it names no path")
    pattern = _escaped_globstar(pattern) if "**\\/" in pattern else pattern
    spanning = _spanning(pattern) if anchored else None
    if spanning is not None:
        folders, plain, rest = spanning
        if "" in folders:
            raise _Dead("it holds an empty folder name (\"//\")")
        head = [Glob((f,)) for f in folders]
        alternatives = [head + tail for tail in _spanning_segments(plain, rest, problems)]
    else:
        parts = _split_components(pattern)
        if "" in parts:
            raise _Dead("it names no path" if not pattern.strip("/") else "it holds an empty folder name (\"//\")")
        alternatives = [_segments(parts, anchored, problems)]
    alternatives = [segments for segments in alternatives if not any(seg in _NO_NAMES for seg in segments)]
    if not alternatives:  # "./drafts", "../x": git compares them with paths, which never hold such a folder
        raise _Dead("it holds a \".\" or \"..\" folder name, which no path holds (patterns are relative to "
                    f"their folder: write {_without_dot_folders(text, negated)})")
    shown = _as_text(text)
    return [Rule(number, shown, negated, dir_only, anchored, tuple(segments)) for segments in alternatives]


def _without_dot_folders(text: str, negated: bool) -> str:
    """What to write for a line ``./drafts/`` (``"/drafts/"``, the folder's own, as meant;
    ``./docs/*.md`` is ``"docs/*.md"``); an example when no one line does (``../x``, ``./a/../b``)."""
    lead, rest = text[: int(negated)], text[int(negated) :]
    while rest.startswith("./"):
        rest = rest[2:]
    if rest == text[int(negated) :] or not rest.strip("/") or "/./" in f"/{rest}/".replace("/../", "/./"):
        return "\"drafts\", not \"./drafts\""
    return f"\"{_as_text(lead + ('' if '/' in rest.rstrip('/') else '/') + rest)}\""


@frozen
class Problem:
    """A line that is skipped or partly meaningless, and why."""

    line: int
    text: str
    why: str
    skipped: bool


def parse_rules(lines: Sequence[str], first_line: int = 1) -> tuple[list[Rule], list[Problem]]:
    """The rules of ignore-file ``lines`` (numbered from ``first_line``), and the problems."""
    rules: list[Rule] = []
    problems: list[Problem] = []
    for number, line in enumerate(lines, first_line):
        notes: list[str] = []
        try:
            found = _rule(number, line, notes)
        except _Dead as exc:
            problems.append(Problem(number, line, _as_text(str(exc)), True))
            continue
        problems += [Problem(number, line, _as_text(why), False) for why in notes]
        rules += found
    return rules, problems


# ---------------------------------------------------------------------------------------
# A set of rules: the last match decides


class RuleSet:
    """The rules of one folder (or of ``--exclude``), in order; ``decide`` says whether the
    last rule matching a path ignores it (True), takes it back (False), or none matches (None).

    Rules that are a plain name, ``*suffix``, ``prefix*`` or an anchored plain path are kept
    in dictionaries by that text, the others by what a matching path must have, so only
    rules that can match, and can still be the last match, are tried."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._names: dict[str, list[int]] = {}
        self._suffixes: dict[str, list[int]] = {}
        self._prefixes: dict[str, list[int]] = {}
        self._paths: dict[str, list[int]] = {}
        # The other rules, by what a path they match must have: its first component (an
        # anchored rule that starts with a plain name), the last or first character of its
        # name (a glob that ends or starts with a plain piece); ``_others`` have no such key.
        self._first_component: dict[str, list[int]] = {}
        self._last_char: dict[str, list[int]] = {}
        self._first_char: dict[str, list[int]] = {}
        self._others: list[int] = []
        for index, rule in enumerate(self.rules):
            table, text = self._key(rule)
            if table is None:
                self._others.append(index)
            else:
                table.setdefault(text, []).append(index)
        self._suffix_lengths = sorted({len(s) for s in self._suffixes})
        self._prefix_lengths = sorted({len(s) for s in self._prefixes})

    def _key(self, rule: Rule) -> tuple[dict[str, list[int]] | None, str]:
        """The table a rule is filed in and its key there."""
        segments = rule.segments
        if rule.anchored:
            first = segments[0]
            if first is None or len(first.pieces) != 1 or not isinstance(first.pieces[0], str):
                return None, ""
            if all(s is not None and len(s.pieces) == 1 and isinstance(s.pieces[0], str) for s in segments):
                return self._paths, "/".join(s.pieces[0] for s in segments)  # type: ignore[union-attr]
            return self._first_component, first.pieces[0]
        pieces = segments[0].pieces  # type: ignore[union-attr]
        if all(isinstance(p, str) for p in pieces):
            if len(pieces) == 1:
                return self._names, pieces[0]  # type: ignore[return-value]
            if len(pieces) == 2 and pieces[0] == "" and pieces[1]:
                return self._suffixes, pieces[1]  # type: ignore[return-value]
            if len(pieces) == 2 and pieces[1] == "" and pieces[0]:
                return self._prefixes, pieces[0]  # type: ignore[return-value]
        if isinstance(pieces[-1], str) and pieces[-1]:
            return self._last_char, pieces[-1][-1]
        if isinstance(pieces[0], str) and pieces[0]:
            return self._first_char, pieces[0][0]
        return None, ""

    def __bool__(self) -> bool:
        return bool(self.rules)

    def _applies(self, index: int, is_dir: bool) -> bool:
        return is_dir or not self.rules[index].dir_only

    def _last_of(self, found: list[int] | None, best: int, is_dir: bool) -> int:
        if found:
            for index in reversed(found):
                if index <= best:
                    break
                if self._applies(index, is_dir):
                    return index
        return best

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """For ``rel`` (``/``-separated, relative to the rules' folder)."""
        rel = _as_bytes(rel)
        name = rel.rpartition("/")[2]
        best = self._last_of(self._names.get(name), -1, is_dir)
        best = self._last_of(self._paths.get(rel), best, is_dir)
        for n in self._suffix_lengths:
            if n > len(name):
                break
            best = self._last_of(self._suffixes.get(name[-n:]), best, is_dir)
        for n in self._prefix_lengths:
            if n > len(name):
                break
            best = self._last_of(self._prefixes.get(name[:n]), best, is_dir)
        parts = rel.split("/")
        candidates = [found for found in (self._others, self._first_component.get(parts[0]),
                                          self._last_char.get(name[-1:]), self._first_char.get(name[:1])) if found]
        ordered = heapq.merge(*(reversed(found) for found in candidates), reverse=True) if len(candidates) > 1 else (
            reversed(candidates[0]) if candidates else ())
        for index in ordered:
            if index <= best:
                break
            rule = self.rules[index]
            if rule.dir_only and not is_dir:
                continue
            if rule.anchored:
                hit = _path_matches(rule.segments, parts)
            else:
                hit = rule.segments[0].matches(name)  # type: ignore[union-attr]
            if hit:
                best = index
                break
        return None if best < 0 else not self.rules[best].negated
