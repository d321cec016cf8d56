"""A gitignore pattern's ``[...]`` classes, parsed as git's ``wildmatch`` reads them
(``crag.index.globs`` compiles the rest of the pattern): single characters, ranges,
``[:alpha:]``-style names and ``!``/``^`` negation. A class never matches ``/``."""

from __future__ import annotations

__all__ = ["CharClass", "Dead", "parse_class"]


class CharClass:
    """A ``[...]`` class: single characters, ranges and named classes, maybe negated."""

    __slots__ = ("chars", "named", "negated", "ranges")

    def __init__(self, chars: frozenset[str], ranges: tuple[tuple[str, str], ...],
                 named: tuple[frozenset[str], ...], negated: bool) -> None:
        self.chars, self.ranges, self.named, self.negated = chars, ranges, named, negated

    def matches(self, ch: str) -> bool:
        if ch == "/":
            return False
        found = ch in self.chars or any(lo <= ch <= hi for lo, hi in self.ranges) or any(ch in s for s in self.named)
        return found != self.negated


_ASCII = [chr(i) for i in range(128)]
_NAMED_CLASSES = {
    "alnum": frozenset(c for c in _ASCII if c.isalnum()),
    "alpha": frozenset(c for c in _ASCII if c.isalpha()),
    "blank": frozenset(" \t"),
    "cntrl": frozenset(c for c in _ASCII if ord(c) < 32 or ord(c) == 127),
    "digit": frozenset("0123456789"),
    "graph": frozenset(c for c in _ASCII if 33 <= ord(c) <= 126),
    "lower": frozenset("abcdefghijklmnopqrstuvwxyz"),
    "print": frozenset(c for c in _ASCII if 32 <= ord(c) <= 126),
    "punct": frozenset(c for c in _ASCII if 33 <= ord(c) <= 126 and not c.isalnum()),
    "space": frozenset(" \t\n\r\f\v"),
    "upper": frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    "xdigit": frozenset("0123456789abcdefABCDEF"),
}


class Dead(Exception):
    """A pattern git would never match: the line is skipped, and why is said."""


def parse_class(text: str, i: int, problems: list[str]) -> tuple[CharClass, int]:
    """The class opening at ``text[i] == "["`` and the index after its ``]`` (git's wildmatch)."""
    start = i
    i += 1
    negated = i < len(text) and text[i] in "!^"
    if negated:
        i += 1
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    named: list[frozenset[str]] = []
    prev: str | None = None
    first = True
    while True:
        if i >= len(text):
            raise Dead(f"the \"[\" at {start + 1} is not closed (write \\[ for a bracket)")
        ch = text[i]
        if ch == "]" and not first:
            return CharClass(frozenset(chars), tuple(ranges), tuple(named), negated), i + 1
        first = False
        if ch == "\\":
            i += 1
            if i >= len(text):
                raise Dead("it ends in an escaping backslash")
            ch = text[i]
            chars.add(ch)
            prev = ch
        elif ch == "-" and prev is not None and i + 1 < len(text) and text[i + 1] != "]":
            i += 1
            hi = text[i]
            if hi == "\\":
                i += 1
                if i >= len(text):
                    raise Dead("it ends in an escaping backslash")
                hi = text[i]
            if hi < prev:
                problems.append(f"the range {prev}-{hi} is empty, so it matches nothing")
            else:
                ranges.append((prev, hi))
            prev = None
        elif ch == "[" and text.startswith(":", i + 1):
            close = text.find("]", i + 2)
            if close < 0:
                raise Dead(f"the \"[\" at {start + 1} is not closed (write \\[ for a bracket)")
            body = text[i + 2:close]
            if not body.endswith(":"):  # no ":]": the "[" is an ordinary member
                chars.add("[")
                prev = "["
            else:
                name = body[:-1]
                if name not in _NAMED_CLASSES:
                    raise Dead(f"[:{name}:] is not a character class ({', '.join(f'[:{n}:]' for n in _NAMED_CLASSES)})")
                named.append(_NAMED_CLASSES[name])
                prev = None
                i = close
        else:
            chars.add(ch)
            prev = ch
        i += 1
