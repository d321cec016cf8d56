"""What a piece of an answer claims: its content words, its anchors and its polarity.

``claims(text)`` reads a sentence (markers ignored) into a ``Claims`` record:

* content words: stemmed words that are neither stop words, answer scaffolding ("Here is
  what I found"), negations nor numbers; a run of Han and Kana, written without spaces, as
  its character bigrams, function characters left out (``crag.text.unspaced``);
* anchors: what must appear verbatim in the evidence, of the kinds ``ANCHOR_KINDS`` lists
  (inline code, URLs, identifiers, numbers, month names), each kind with how it is found in
  an answer and how an evidence text is read for it;
* polarity: whether the sentence negates (``NEGATION`` words, or any ``n't``, or a thing kept
  from doing another: "prevents electrons from occupying" as "electrons cannot occupy").

It also owns the two tests on a whole sentence that decide whether it is judged at all
(``restates``, ``lead_in``) and how a sentence is cut into clauses (``clauses``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from attrs import frozen

from ..answer import code_split, rewrite_markers
from ..safe_text import for_terminal
from ..text import HAN_KANA, STOPWORDS, in_vocabulary, stem, unspaced, words

__all__ = [
    "ANCHOR_KINDS",
    "CLAUSE_WORDS",
    "SCAFFOLDING",
    "UNSUPPORTED_TAG",
    "AnchorKind",
    "Claims",
    "claims",
    "clauses",
    "has_anchor",
    "lead_in",
    "negated",
    "restates",
    "strip_markers",
]

UNSUPPORTED_TAG = "[unsupported]"
CLAUSE_WORDS = 3  # fewest content words and anchors of a clause judged on its own
# Where a sentence's clauses end: after a comma or semicolon (not one inside a marker, "[1, 2]"),
# and after the model's own markers when the sentence goes on ("... 8080 [1] and the client ...").
_CLAUSE_BREAK = re.compile(r"\[\s*\d+(?:\s*[-\u2013,;]\s*\d+)*\s*\](?:[ \t]?\[\s*\d+\s*\])*[ \t]+(?=[^\s\[.,;:!?])"
                           r"|[,;](?![^\[\]]*\])[ \t]+")

# Words that make a sentence about the answer rather than about the subject.
SCAFFOLDING = frozenset(
    """
    answer answers summary summarize summarized found find following follows here below above
    evidence source sources documentation docs doc document documents based according
    information info passage passages provided context question questions mention mentions
    mentioned say says said see sure certainly hope helps help note notes detail details
    relevant available let look looks steps step overview quick short brief like would
    welcome glad happy pleasure feel free ask asking hesitate reach assist assistance anything
    else thanks thank need re ve ll follow example examples
    """.split()
)  # and courtesy: "You're welcome!", "Feel free to ask if you have other questions."
NEGATION = frozenset(
    "not no never cannot can't won't don't doesn't isn't aren't wasn't weren't shouldn't mustn't "
    "didn't couldn't wouldn't hasn't haven't hadn't without none neither nor".split()
)
NUMBER_WORDS = {
    w: str(n) for n, w in enumerate(
        "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()) if w != "_"
} | {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
     "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
     "twice": "2"}
_DIGIT_WORDS = {digits: word for word, digits in NUMBER_WORDS.items() if word != "twice"}
# Ordinals state a fact as a number does ("the third English colony"); "first", "second" and
# "last" are left out: instructions and units use them ("first, install it", "per second").
ORDINALS = {
    w: n for n, w in enumerate(
        "_ _ _ third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth fourteenth "
        "fifteenth sixteenth seventeenth eighteenth nineteenth twentieth".split()) if w != "_"
}
# Month names are anchors of a date ("May" is left out: it is mostly a verb).
_MONTHS = "january february march april june july august september october november december".split()

_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_URL = re.compile(r"https?://[^\s<>()\[\]`\"']+")
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
# A number standing alone ("3.12", "v2"; beside Han or Kana too, which are written without spaces:
# the 9 of "上午9点"), or a dotted one written on after letters ("py3.12", "transformers5.8.1":
# its digits from the first, never "12" or "8.1" alone, which no text holds as a number of its own)
_NUMBER = re.compile(rf"(?<![^\W{HAN_KANA}])v?(\d+(?:[.,:/-]\d+)*)|(?<=[A-Za-z])(\d+(?:[.,]\d+)+)")
_IDENT = re.compile(
    r"(?<![\w./-])(?:--?[A-Za-z][\w-]*|[A-Za-z_][\w-]*(?:[./][\w-]+)+|[A-Za-z]*_[\w]*|"
    r"[a-z]+[A-Z][\w]*|[A-Z]+[a-z]+[A-Z][\w]*|[A-Z][A-Z0-9]*_[A-Z0-9_]+)(?![\w])"
)
_MONTH = re.compile(r"\b(" + "|".join(_MONTHS) + r")\b", re.I)
_VERSION = re.compile(r"[vV]\d+(?:\.\d+)*")  # "v2.1": the number 2.1 ("v3" is the number 3)
_NOT_IDENT = frozenset({"e.g", "i.e", "a.k.a", "vs", "etc"})
PREFIX = re.compile(r"^[ \t]*(?:>[ \t]?)*(?:(?:[-*+]|\d{1,3}[.)])[ \t]+)?")  # "> ", "- ", "1. "; not "**bold**"


# -- anchor kinds ----------------------------------------------------------------------------


def _find_code(text: str) -> Iterable[str]:
    for m in _INLINE_CODE.finditer(text):
        code = " ".join(m.group(1).split())
        if code:
            yield code


def _find_urls(text: str) -> Iterable[str]:
    return (m.group(0).rstrip(".,;:!?") for m in _URL.finditer(text))


def _find_idents(text: str) -> Iterable[str]:
    for m in _IDENT.finditer(text):
        token = m.group(0)
        if token.lower() in _NOT_IDENT or _VERSION.fullmatch(token) or ("/" in token and not token.startswith("/") and not any(
                ch in token for ch in "._")):
            continue  # "e.g", "read/write": prose, not an identifier; "v2.1": a version, read as a number
        yield token


# Full-width digits ("午前１０時", typed with a Chinese or Japanese input method) are the same
# number as ASCII ones ("午前10時"): numbers are read, in an answer and in the evidence, with them
# folded to ASCII (their NFKC form).
_FULL_WIDTH_DIGITS = str.maketrans("０１２３４５６７８９", "0123456789")


# ... and so are a full-width point, comma, colon and hyphen between digits ("３．１０",
# "１，５００", "９：００", "１０－１５").
_FULL_WIDTH_SEPARATOR = re.compile("(?<=[0-9\uff10-\uff19])[\uff0e\uff0c\uff1a\uff0d](?=[0-9\uff10-\uff19])")
_ASCII_SEPARATOR = {"\uff0e": ".", "\uff0c": ",", "\uff1a": ":", "\uff0d": "-"}


def _ascii_digits(text: str) -> str:
    if not any("\uff0c" <= ch <= "\uff1a" for ch in text):
        return text
    text = _FULL_WIDTH_SEPARATOR.sub(lambda m: _ASCII_SEPARATOR[m.group()], text)
    return text.translate(_FULL_WIDTH_DIGITS)


def _find_numbers(text: str) -> Iterable[str]:
    return ((m.group(1) or m.group(2)).rstrip(".,:/-") for m in _NUMBER.finditer(_ascii_digits(text)))


def _find_months(text: str) -> Iterable[str]:
    return (m.group(1).lower() for m in _MONTH.finditer(text))


def _find_number_words(text: str) -> Iterable[str]:
    return (w for w in words(text) if w in NUMBER_WORDS)


# A name of letters then digits ("item106", "Python3", "H100", "mp3"): a version ("v3") is a number.
_ALNUM = re.compile(r"(?<![\w/.-])(?!v\d+(?![A-Za-z]))([A-Za-z]+\d[A-Za-z\d]*)(?![\w])")


def _find_alnum(text: str) -> Iterable[str]:
    return (m.group(1) for m in _ALNUM.finditer(text))


def _holds_alnum(anchor: str, text: str, flat: str) -> bool:
    """"item106" is held as written, or with a space, slash, dot or dash between its letters and
    digits ("HTTP/2" holds "HTTP2"); never inside a longer name ("item1" is not "item106")."""
    runs = re.findall(r"[A-Za-z]+|\d+", anchor)
    pattern = r"[\s/._-]?".join(re.escape(r) for r in runs)
    return re.search(rf"(?<![A-Za-z0-9]){pattern}(?![A-Za-z0-9])", text, re.I) is not None


def _find_ordinals(text: str) -> Iterable[str]:
    return (w for w in words(text) if w in ORDINALS)


def _holds_ordinal(anchor: str, text: str, flat: str) -> bool:
    """"third" and "3rd" are the same ordinal."""
    n = ORDINALS[anchor]
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return re.search(rf"\b(?:{anchor}|{n}{suffix})\b", text, re.I) is not None


def _holds_verbatim_flat(anchor: str, text: str, flat: str) -> bool:
    return anchor in flat  # whitespace aside


def _holds_verbatim(anchor: str, text: str, flat: str) -> bool:
    return anchor in text


_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # "1,500", "12,000.5": thousands separated
_GROUP_SEPARATOR = "[,\u00a0\u202f\u2009]?"  # a comma, or a (narrow, thin) no-break space
# A range's dash: "10-15" is written "10–15" (an en dash) in most prose, and a model types a hyphen.
_DASH = re.compile(r"\\-")
_ANY_DASH = "[-\u2010-\u2015\u2212]"


def _digits_pattern(number: str) -> str:
    """A pattern for ``number`` (digits, maybe a decimal part) written with or without
    separators between its thousands: "1500", "1,500" and "1 500" (no-break space) are one number;
    a range's hyphen is any dash ("10-15" and "10–15" are one range); a whole number with or
    without a decimal part of zeros ("5" and "5.0"; not "3.1" and "3.10", which versions tell apart)."""
    ends = re.fullmatch(r"([\d,.]*\d)-([\d,.]*\d)", number)
    if ends is not None:  # a range: each end as a number ("10-15" and "10.0-15.0")
        return _ANY_DASH.join(_digits_pattern(end) for end in ends.groups())
    whole = re.fullmatch(r"([\d,]*\d)(?:\.0+)?", number)
    if whole is not None:
        return _digits_pattern_of(whole.group(1)) + r"(?:\.0+)?"
    return _digits_pattern_of(number)


def _digits_pattern_of(number: str) -> str:
    if "," in number and not _GROUPED.fullmatch(number):
        return re.escape(number)  # "1,2": two numbers, not one in thousands
    whole, dot, decimals = number.replace(",", "").partition(".")
    if not whole.isdigit() or len(whole) < 4:
        return _DASH.sub(_ANY_DASH, re.escape(number))
    head = len(whole) % 3 or 3
    groups = [whole[:head]] + [whole[i : i + 3] for i in range(head, len(whole), 3)]
    return _GROUP_SEPARATOR.join(groups) + re.escape(dot + decimals)


def _holds_number(anchor: str, text: str, flat: str) -> bool:
    """"3" and "three" are the same number, and so are "1500" and "1,500", and "10" and "１０"
    (full-width digits); "3" is not part of "3.10" nor of "13"."""
    anchor, text = _ascii_digits(anchor), _ascii_digits(text)
    if anchor.isalpha():
        forms = [anchor, NUMBER_WORDS[anchor]]
    else:
        forms = [anchor] + ([_DIGIT_WORDS[anchor]] if anchor in _DIGIT_WORDS else [])
    return any(
        re.search((r"\b" + re.escape(f) + r"\b") if f.isalpha()
                  else (r"(?<!\d)(?<!\d[.,:])" + _digits_pattern(f) + r"(?!\d|[.,:]\d)"), text, re.I)
        for f in forms
    )


# Units a number is measured in, by dimension: "5 GB" is not "5 MB", nor "24 hours" "24 minutes".
_UNITS = {
    unit: (dimension, canonical)
    for dimension, table in {
        "time": {"ms": "ms millisecond milliseconds", "s": "sec secs second seconds",
                 "min": "min mins minute minutes", "h": "h hr hrs hour hours", "d": "day days",
                 "wk": "week weeks", "mo": "month months", "yr": "yr yrs year years"},
        "size": {"b": "byte bytes", "kb": "kb kib kilobyte kilobytes", "mb": "mb mib megabyte megabytes",
                 "gb": "gb gib gigabyte gigabytes", "tb": "tb tib terabyte terabytes", "pb": "pb pib petabyte petabytes"},
        "mass": {"mg": "mg milligram milligrams", "g": "g gram grams", "kg": "kg kilogram kilograms",
                 "lb": "lb lbs pound pounds", "oz": "oz ounce ounces"},
        "length": {"mm": "mm millimetre millimetres millimeter millimeters", "cm": "cm centimetre centimetres "
                   "centimeter centimeters", "m": "m metre metres meter meters", "km": "km kilometre kilometres "
                   "kilometer kilometers", "mi": "mile miles", "ft": "ft foot feet"},
    }.items()
    for canonical, names in table.items()
    for unit in names.split()
}
_QUANTITY = re.compile(r"(?<![\w.,])(\d+(?:[.,]\d+)*)(?:(\s)|(?=[A-Za-z]))([A-Za-z]+)\b")


def _unit(number_end: int, text: str) -> tuple[str, str] | None:
    """The unit (dimension, canonical name) written right after a number ending at ``number_end``."""
    m = re.match(r"(\s?)([A-Za-z]+)\b", text[number_end:])
    if m is None or (not m.group(1) and m.group(2).lower() == "s"):
        return None  # "the 1990s": a decade, not seconds
    return _UNITS.get(m.group(2).lower())


def _find_quantities(text: str) -> Iterable[str]:
    text = _ascii_digits(text)
    for m in _QUANTITY.finditer(text):
        if _unit(m.end(1), text) is not None:
            yield m.group(0)


_ANY_NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*")


def _holds_quantity(anchor: str, text: str, flat: str) -> bool:
    """A number with its unit ("5 GB") is held where the number is written with the same
    unit, or with no unit of that kind while the unit measures no other number; not where
    it has another unit ("5 MB"); full-width digits are their ASCII ones."""
    anchor, text = _ascii_digits(anchor), _ascii_digits(text)
    m = _QUANTITY.match(anchor)
    number = m.group(1) if m else anchor
    wanted = _unit(m.end(1), anchor) if m else None
    pattern = r"(?<!\d)(?<!\d[.,:])" + _digits_pattern(number) + r"(?!\d|[.,:]\d)"
    if number in _DIGIT_WORDS:
        pattern = rf"(?:{pattern}|\b{_DIGIT_WORDS[number]}\b)"  # "30 days" and "thirty days"
    loose = False  # the number written with no unit of that kind
    for found in re.finditer(pattern, text, re.I):
        unit = _unit(found.end(), text)
        if wanted is None or unit == wanted:
            return True
        loose = loose or unit is None or unit[0] != wanted[0]
    # ... holds it only when that unit measures no other number there ("3 copies for 7 days"
    # does not hold "3 days")
    return loose and not any(_unit(m.end(), text) == wanted for m in _ANY_NUMBER.finditer(text))


# A decade or century written as years ("the 1990s", "the 1700s", "1700's"): a span, not a year.
DECADE = re.compile(r"\b(1\d\d0|20\d0)'?s\b")


def _find_decades(text: str) -> Iterable[str]:
    return (m.group(1) + "s" for m in DECADE.finditer(text))


def _holds_decade(anchor: str, text: str, flat: str) -> bool:
    """"The 1700s" is held by a year within it (1700 to 1799) or by "the 18th century";
    "the 1990s" by a year from 1990 to 1999."""
    year = anchor[:4]
    if year.endswith("00"):
        century = int(year[:2]) + 1
        if re.search(rf"\b{century}(?:st|nd|rd|th)[ -]century\b", text, re.IGNORECASE):
            return True
        return re.search(rf"\b{year[:2]}\d\d(?:'?s)?\b", text) is not None
    return re.search(rf"\b{year[:3]}\d(?:'?s)?\b", text) is not None


def _holds_month(anchor: str, text: str, flat: str) -> bool:
    return re.search(rf"\b(?:{anchor}|{anchor[:3]})\b", text, re.I) is not None


def _holds_word(anchor: str, text: str, flat: str) -> bool:
    return re.search(r"(?<![\w])" + re.escape(anchor) + r"(?![\w])", text, re.I) is not None


@frozen
class AnchorKind:
    """One kind of anchor: how an answer's text is searched for it (``find``), whether the
    text is then hidden from the kinds after it (``hides``: a URL's digits are not a
    number), and how an evidence text is read for one (``held(anchor, text, flat)``, where
    ``flat`` is the text with its whitespace made single spaces)."""

    name: str
    find: Callable[[str], Iterable[str]]
    held: Callable[[str, str, str], bool]
    hides: tuple[re.Pattern[str], ...] = ()


# In the order they are read; a kind's ``hides`` apply to all the kinds after it.
ANCHOR_KINDS: tuple[AnchorKind, ...] = (
    AnchorKind("code", _find_code, _holds_verbatim_flat, hides=(_INLINE_CODE,)),
    AnchorKind("url", _find_urls, _holds_verbatim, hides=(_URL, _LINK_TARGET)),  # and a Markdown link's target
    AnchorKind("ident", _find_idents, _holds_word),
    AnchorKind("alnum", _find_alnum, _holds_alnum),
    AnchorKind("decade", _find_decades, _holds_decade, hides=(DECADE,)),  # not the year 1700
    AnchorKind("quantity", _find_quantities, _holds_quantity),  # and its number, below
    AnchorKind("number", _find_numbers, _holds_number),
    AnchorKind("month", _find_months, _holds_month),
    AnchorKind("number", _find_number_words, _holds_number),  # "three", after the digits
    AnchorKind("ordinal", _find_ordinals, _holds_ordinal),
)
_HELD = {kind.name: kind.held for kind in ANCHOR_KINDS}
_HIDDEN_AS = {_LINK_TARGET: "] "}  # what a hidden match leaves behind (else a space)


def has_anchor(kind: str, anchor: str, text: str, flat: str) -> bool:
    """Whether ``text`` (``flat``: the same with single spaces) holds ``anchor`` of ``kind``."""
    return _HELD[kind](anchor, text, flat)


# -- claims ----------------------------------------------------------------------------------


@frozen
class Claims:
    """What a piece says: content words (stemmed) and anchors that must appear verbatim."""

    words: frozenset[str]
    anchors: tuple[tuple[str, str], ...]  # (kind, text): code, url, number, decade, ident, month
    negated: bool

    @property
    def empty(self) -> bool:
        return not self.words and not self.anchors


def strip_markers(text: str) -> str:
    """``text`` without its ``[K]`` markers and ``[unsupported]`` tags (code left alone)."""
    pieces = code_split(rewrite_markers(text, lambda numbers: ""))
    for i in range(0, len(pieces), 2):
        pieces[i] = pieces[i].replace(UNSUPPORTED_TAG, "")
    return "".join(pieces)


def negated_outside_code(text: str) -> bool:
    """Whether ``text`` negates in its own words: a "not" inside inline code (which may run
    over a line break) belongs to the code, as ``claims`` reads an answer's sentence."""
    return negated(_ANY_CODE_SPAN.sub(" ", text))


_ANY_CODE_SPAN = re.compile(r"`[^`]+`")


# "prevents electrons from occupying" says what "electrons cannot occupy" does, so it negates too
_KEPT_FROM = re.compile(
    r"\b(?:prevent|stop|keep|kept|prohibit|bar|block)(?:s|ed|ing|ped|ping|red|ring)?"
    r"(?:\s+[^\s.;:!?]+){0,6}?\s+from\s+[a-z]+ing\b"
)


# Phrases built on a negation word that negate nothing: "syncs every 88 hours without fail" says
# that it syncs, "no doubt" and "not only ... but" likewise.
# ("without delay" or "without interruption" do negate what follows: not among them)
_AFFIRMING = re.compile(r"\bwithout (?:fail|a doubt|doubt)\b|\bno doubt\b|\bnot only\b")


def negated(text: str) -> bool:
    """Whether ``text`` holds a negation word (``NEGATION``, or any ``n't``), or says that
    something keeps a thing from doing another ("prevents electrons from occupying"); phrases
    that affirm in a negation's words ("without fail", ``_AFFIRMING``) are not one."""
    low = _AFFIRMING.sub(" ", text.lower().replace("’", "'"))
    tokens = re.findall(r"[a-z]+(?:'[a-z]+)?", low)
    return any(t in NEGATION or t.endswith("n't") for t in tokens) or _KEPT_FROM.search(low) is not None


def claims(text: str) -> Claims:
    """The content words and anchors of a piece of answer text (markers ignored; escape
    sequences too, as a terminal shows them: ``\\x1b[31m`` is no word and no number 31)."""
    prose = PREFIX.sub("", strip_markers(for_terminal(text)), count=1)
    anchors: list[tuple[str, str]] = []
    for kind in ANCHOR_KINDS:
        anchors.extend((kind.name, a) for a in kind.find(prose))
        for pattern in kind.hides:
            prose = pattern.sub(_HIDDEN_AS.get(pattern, " "), prose)
    content = set()
    for word in words(prose):
        spaced, terms = unspaced(word)  # Han and Kana: character bigrams (crag.text.unspaced)
        content.update(terms)
        for w in spaced:
            if w.isdigit() or _VERSION.fullmatch(w) or w in STOPWORDS or w in SCAFFOLDING or w in NEGATION or w in NUMBER_WORDS or w in ORDINALS:
                continue
            s = stem(w)
            if len(s) < 2 or s in STOPWORDS or s in SCAFFOLDING:
                continue
            content.add(s)
    return Claims(frozenset(content), tuple(dict.fromkeys(anchors)), negated(prose))


# -- sentences that are not judged, and clauses ----------------------------------------------


def restates(c: Claims, asked: frozenset[str]) -> bool:
    """Text that only restates the question: no anchor, and every content word of it is one
    of the question's."""
    return bool(asked) and not c.anchors and all(in_vocabulary(w, asked) for w in c.words)


# Words a lead-in uses to name what follows it ("Here's an example code snippet:").
INTRODUCING = frozenset("code snippet sample usage show demonstrate illustrate python script".split())


def lead_in(c: Claims, text: str, asked: frozenset[str]) -> bool:
    """A lead-in that only restates the question or names what it introduces ("To render
    Jinja2 templates from an endpoint, follow these steps:", "Here's an example code
    snippet:"): it ends with a colon. What it introduces is judged on its own."""
    if not text.rstrip().endswith(":") or c.anchors:
        return False
    return restates(c, asked | INTRODUCING)


def _clause(text: str) -> bool:
    """Whether a part of a sentence says enough to be judged alone: a content word, and at
    least ``CLAUSE_WORDS`` content words, names, numbers and code spans in all."""
    c = claims(text)
    return bool(c.words) and len(c.words) + len(c.anchors) >= CLAUSE_WORDS


def clauses(text: str) -> list[str]:
    """``text`` cut after its commas and semicolons and after a marker the sentence goes on
    from (outside code) into clauses that each
    say enough to be judged alone (``_clause``); a shorter part stays with the clause before
    it, so a list of names ("`Path`, `Query` and `Cookie`") or a short aside stays whole.
    The clauses concatenate to ``text``."""
    cuts = [0]
    pieces = code_split(text)
    pos = 0
    for i, part in enumerate(pieces):
        if i % 2 == 0:
            cuts.extend(pos + m.end() for m in _CLAUSE_BREAK.finditer(part))
        pos += len(part)
    parts = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)], strict=True) if b > a]
    out: list[str] = []
    for part in parts:
        if out and not (_clause(out[-1]) and _clause(part)):
            out[-1] += part
        else:
            out.append(part)
    return out
