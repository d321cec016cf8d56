"""What a question names that the evidence must hold for the question to be answered.

A question about ``HTTP/3``, ``gRPC`` or ``Terraform`` is not answered by passages that never
mention it, however well the rest of the question matches them: retrieval finds the nearest
passages there are, and a model asked to answer from them writes what the question expects.
``named`` picks the terms a question names: a token with a letter and a digit (``HTTP/3``,
``OAuth2``), with a capital after its first letter (``gRPC``, ``TypeScript``, ``JWT``), or a
capitalised word that does not open a sentence (``Terraform``); consecutive plain
capitalised words are one name (``Apple Watch``). ``missing`` is the named terms no evidence item holds,
compared without case, spaces and punctuation (``Hugging Face`` holds ``huggingface``), or with a
word in another form a text writes as a name (capitalised where no sentence or line opens): its
other number ("Academic Rankings" is held by "Academic Ranking"), the name its demonym is made
from ("Israelis" by "Israel"; ``_forms``); "Team leads approve ..." does not name "Teams".

``addresses`` asks the same of the passages an answer's supported sentences rest on: that they
are about what the question asks, not only that they hold the answer's words (SPEC §7). A
question about January answered from a passage about a July record, or about a neighbourhood's
features answered from a passage about a telephone's bandwidth, is not addressed. The passages
(the whole evidence items the supported sentences cite, ``cited``) must hold every anchor the
question writes (a number, a month, an identifier, code; a number as a number of its own or
opening one, as 3.11 opens "3.11.4" and 9 "09:00", not inside "0.95.0" or 2.95; a decade or
century written as years, "the 1700s", is held by a year within it or by "the 18th century")
and share a content word with it (stems one letter apart count as one; the words of an anchor
are not counted again, since a passage that quotes ``secrets.compare_digest`` as code holds no
words of it; two words written as one, "web page" and "webpage", are the same words). Measured on the project's documentation questions with a
small model, a stricter test (every named term, a third of the content words) refused right
answers whose chunk says "partial updates" for "partially update ... PATCH"
(docs/real-models.md); what is caught is an answer resting on a passage about something else.

A factual question that negates ("What do encrypted broadcasts never require?", "What is
represented by non-binary notation?") is addressed only by passages with a sentence that
negates too and holds a third of the question's words: a passage that says what encrypted
broadcasts require does not say what they never require, and a small model asked the one
answers with the other. A question negates with "not" and its kin, with "non" ("non-binary",
"non paid"), or with a word under a prefix ("un", "in", "il", "ir") that the passages write
only without it ("insignificant amounts" asked of passages that say "significant amounts";
what follows the prefix has five letters or more; the passage's sentence that negates must then
write that word: "does not carry significant amounts", not a "not" about ships). A passage negates with "not" and its kin, with a word such as
"lacks", "missing" or "except", or with a word of the question under a negative prefix ("not
valid": "invalid"). "How" and "why" questions and those answered yes or no are left alone:
"How do I make a field not required?" is answered by how to make it optional. Measured on the
tuning half of the project's SQuAD 2.0 questions (docs/real-models.md), this catches half of
the unanswerable questions that negate (176 of 351, from the first passage found), and would
refuse 6 of the 2,085 answerable ones (of the 49 that negate and whose passage holds the
answer).

A factual question turned into another by writing a word's opposite ("Which branch has had the
least influence?", "What area of science is understanding slowly changing?") is likewise not
addressed by passages that write the opposite ("most", "rapidly") and never the word itself
(``OPPOSITES``). Measured on the first passage found for each question of the SQuAD 2.0
split's tuning half, this catches 77 of 2,195 unanswerable questions and refuses 2 of 1,952
answerable ones; on the held-out half, reported only, 42 of 2,038 and 12 of 1,896.

``unpointed`` is the question without the paths it names of files the evidence comes from: a
question that points at its source ("... see docs/v2/setup.md") names where the answer is, not
a term the passages must write, so the path is neither a named term nor an anchor. The same
holds for the other sources a question can point at: a URL fetched, a Jira issue's key, a
Confluence page named as the tools take it ("Confluence page 1234", ``pageId=1234``).

``says_nothing_new`` asks whether an answer's supported sentences say anything the question does not:
"What problem consists of trying to increase oil supplies?" answered by "The problem consists
of trying to increase oil supplies [1]" quotes a passage and answers nothing. A question that
asks for something (not one answered yes or no) is answered only by a word, number or name it
does not hold itself (a capital letter standing alone is a name: "B cells and T cells"), or by
a "no".

Measured on the project's documentation questions (docs/real-models.md, "Questions the
knowledge base cannot answer"): no answerable question had a named term missing from its
top five passages; seven of the eight unanswerable ones did.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from itertools import pairwise

from ..prompts.find import confluence_mentions, find_jira_keys, find_paths, find_urls
from ..sentences import sentences
from ..state import EvidenceItem
from ..text import fold_diacritics, in_vocabulary, stem, words
from .claims import claims, has_anchor, negated_outside_code, strip_markers
from .evidence import document_name

__all__ = [
    "FOCUS_SHARE",
    "HELD_SHARE",
    "NEGATED_SHARE",
    "OPPOSITES",
    "QUOTES_FOCUS_SHARE",
    "absent",
    "addresses",
    "cited",
    "holds_focus",
    "missing",
    "named",
    "negation_held",
    "opposed",
    "says_nothing_new",
    "unpointed",
    "writes_any",
]

# letters of any script ("Schrödinger" is one token, not "Schr"); compared by ``_flat``
_TOKEN = re.compile(r"[^\W_][\w+#./-]*(?:[^\W_]|[+#])|[^\W_]")
# capitalised words that name nothing: how questions and sentences open
_PLAIN = frozenset(
    "I How What Which Where When Why Who Whose Can Could Do Does Did Is Are Was Were Should Would "
    "Will Shall May Might Must Has Have Had The A An My Our Your Its Their This That These Those "
    "In On At For With To Of And Or But If Not No Yes Please Is Any Some".split()
)
_NOT_WORD = re.compile(r"[^0-9a-z]+")


# Letters a name is typed without that no accent folding reads as another (full-text search
# keeps them apart, crag.text.DIACRITICS): "Boleslaw" and "Lodz" name "Bolesław" and "Łódź".
_PLAIN_LETTERS = str.maketrans({"ł": "l", "ø": "o", "đ": "d", "ð": "d", "ı": "i", "ß": "ss", "æ": "ae", "œ": "oe",
                                "þ": "th", "ħ": "h", "ŧ": "t", "ŀ": "l", "ĳ": "ij", "ǿ": "o", "ǽ": "ae", "ǣ": "ae", "ſ": "s"})


def _flat(text: str) -> str:
    """``text`` lower-cased, folded (full-width letters and digits are ASCII ones: "API" writes
    "ＡＰＩ") and without what is not a letter or a digit: "Schrodinger" writes "Schrödinger"."""
    return _NOT_WORD.sub("", fold_diacritics(unicodedata.normalize("NFKC", text).lower()).translate(_PLAIN_LETTERS))


def named(question: str) -> list[str]:
    """The terms ``question`` names, in order, without repeats (see the module doc)."""
    out: list[str] = []
    run: list[str] = []
    run_is_words = [False]  # the run so far is plain capitalised words
    prev_end = -1

    def close() -> None:
        if run:
            term = " ".join(run)
            if term not in out:
                out.append(term)
            run.clear()

    for m in _TOKEN.finditer(question):
        token = m.group().rstrip("./_-")
        if not token:
            continue
        before = question[: m.start()].rstrip()
        letters = any(c.isalpha() for c in token)
        digit = letters and any(c.isdigit() for c in token)
        inner = any(c.isupper() for c in token[1:])
        opens = not before or before[-1] in ".?!:;\"'(`"  # a sentence's first word is capitalised anyway
        capital = token[0].isupper() and not opens and token not in _PLAIN
        word = capital and not (digit or inner)  # a plain capitalised word joins its neighbours
        adjacent = prev_end >= 0 and question[prev_end : m.start()].strip() == ""
        prev_end = m.end()
        if not (digit or inner or capital):
            close()
            continue
        if not (word and adjacent and run_is_words[0]):
            close()
        run.append(token)
        run_is_words[0] = word
    close()
    return out


def unpointed(question: str, sources: Iterable[str]) -> str:
    """``question`` without the file paths it names that are among ``sources`` (evidence
    sources: relative to the working directory, or absolute), compared without a leading
    ``./``, the one path ending with the other (see the module doc)."""
    sources = [str(s) for s in sources]
    held = [s.lstrip("./") for s in sources]
    out = question
    pages = {page for s in sources if "pageId=" in s or "/pages/" in s for _, page in confluence_mentions(s)}
    named_pages = []
    for url in find_urls(question):  # a page fetched: its items' sources are the URL ("#item-K" after it),
        # a Confluence page's is its web address (whatever URL of it the question gave), a Jira issue's its key
        page = any(p in pages for _, p in confluence_mentions(url))
        if (page or any(s == url or s.startswith((url + "#", url.rstrip("/") + "/")) for s in sources)
                or any(key in sources for key in find_jira_keys(url))):
            out = out.replace(url, " ")
            named_pages += [url] if page else []
    named_pages += [said for said, page in confluence_mentions(out) if page in pages]
    for said in named_pages:
        out = out.replace(said, " ")
    keys = [key for key in find_jira_keys(out) if key in sources]
    for key in keys:
        out = re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", " ", out)
    for product, fetched in (("Jira", keys), ("Confluence", named_pages)):  # "... OPS-42 in Jira": where, too
        if fetched:
            out = re.sub(rf"(?i)\b{product}\b", " ", out)
    for path in find_paths(out):
        bare = path.lstrip("./")
        if bare and any(s == bare or s.endswith("/" + bare) or bare.endswith("/" + s) for s in held):
            out = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?![\w/-])", " ", out)
    return out


def missing(question: str, texts: Iterable[str]) -> list[str]:
    """The terms ``question`` names that none of ``texts`` holds (its escape sequences are
    not read: ``\\x1b[31mwhen`` names no term "31mwhen")."""
    from ..safe_text import for_terminal

    return absent(named(unicodedata.normalize("NFC", for_terminal(question))), texts)  # "u\u0308" is "ü"


def writes_any(text: str, terms: Sequence[str]) -> bool:
    """Whether ``text`` writes one of ``terms`` (named terms, ``named``): as one of its tokens,
    or up to three consecutive ones, compared without case, spaces and punctuation ("quick"
    does not write "QUIC"; "Apple Watch" and "http/3" write "Apple Watch" and "HTTP/3")."""
    wanted = {_flat(t) for t in terms} - {""}
    if not wanted:
        return False
    tokens = [_flat(m.group()) for m in _TOKEN.finditer(text)]
    return any("".join(tokens[i : i + n]) in wanted for n in (1, 2, 3) for i in range(len(tokens)))


def absent(terms: Iterable[str], texts: Iterable[str]) -> list[str]:
    """The ones of ``terms`` that none of ``texts`` holds (without case, spaces and punctuation),
    nor writes in another form of its words, capitalised as a name is (``_forms``)."""
    terms = list(terms)
    if not terms:
        return []
    joined = "\n".join(texts)
    blob = _flat(joined)
    out = [t for t in terms if _flat(t) and _flat(t) not in blob]
    if not out:
        return out
    tokens, names, prev_end = [], set(), -1
    for m in _TOKEN.finditer(joined):
        token, gap = m.group(), joined[max(prev_end, 0) : m.start()]
        opens = prev_end < 0 or "\n" in gap or not _OPENERS.isdisjoint(gap) or gap.rstrip()[-1:] in _QUOTES
        prev_end = m.end()
        tokens.append((token[:1].isupper(), _flat(token)))
        if (token[:1].isupper() and not opens) or any(c.isupper() for c in token[1:]):
            names.add(tokens[-1][1])  # "Not" opening "Not every release ..." is no name; "API" is one anywhere
    return [t for t in out if not _written_in_another_form(t, tokens, names)]


_OPENERS = frozenset(".?!:;")  # what a sentence's first word follows, as a line's does (a heading, a list item)
_QUOTES = frozenset("\"'(`|\u201c\u2018\u00ab")
_CAPITALS_PLURAL = re.compile(r"[A-Z][A-Z\d]*s")  # "APIs", "JWTs": the plural of a name in capitals
_NAME_ROOT = 5  # the fewest letters of a name a demonym is read back to ("Israel" of "Israelis"; not "Alex" of "Alexis")


def _forms(written: str) -> set[str]:
    """Other forms a text may write a named word in (lower-cased, without punctuation): a
    plural's singular ("Rankings": "ranking"; "Universities": "university"; "APIs": "api"; an
    "-es" after s, x, z, ch or sh: "Classes": "class"; not the "is" of "Redis", the "us" of
    "Status" nor the "not" of "Notes"), and the name of five letters or more an "-i", "-is",
    "-ian" or "-ians" demonym is made from ("Israelis": "israel"; "Palestinians": "palestine",
    "palestina"...; not "Alexis": "alex")."""
    word = _flat(written)
    forms = set()
    if _CAPITALS_PLURAL.fullmatch(written):
        forms.add(word[:-1])
    elif word.endswith("ies") and len(word) > 4:
        forms.add(word[:-3] + "y")
    elif word.endswith("es"):
        forms |= {word[:-1]} | ({word[:-2]} if word[:-2].endswith(("s", "x", "z", "ch", "sh")) else set())
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        forms.add(word[:-1])
    for suffix in ("ians", "ian", "is", "i"):
        root = word[: -len(suffix)]
        if word.endswith(suffix) and root.isalpha():
            made = {root} if suffix in ("is", "i") else {root, root + "e", root + "a", root + "y"}
            forms |= {name for name in made if len(name) >= _NAME_ROOT}
            break
    return forms


def _same_name(written: str, token: str) -> bool:
    """Whether ``token`` (a text's, lower-cased) writes the named word ``written`` as it is or in
    another form (``_forms``), or is a demonym of the place it names ("palestinian" for "Palestine")."""
    word = _flat(written)
    return token == word or token in _forms(written) or (token.endswith(("ian", "ians")) and word in _forms(token))


def _written_in_another_form(term: str, tokens: Sequence[tuple[bool, str]], names: set[str]) -> bool:
    """Whether ``tokens`` (a text's, each with whether it is capitalised) write ``term`` with
    each of its words as written or in another form, as consecutive capitalised tokens: "Academic
    Rankings" as "Academic Ranking", "Israelis" as "Israel"; "Windows" is not "context window".
    Another form counts only where ``names`` holds it: the text writes it as a name somewhere,
    capitalised where no sentence, line or list item opens ("Team" of "Team leads approve" is not)."""
    words = [(m.group()[:1].isupper(), m.group()) for m in _TOKEN.finditer(term)]
    n = len(words)
    return any(all(capital <= cap and (token == _flat(w) or (token in names and _same_name(w, token)))
                   for (capital, w), (cap, token) in zip(words, tokens[i : i + n], strict=True))
               for i in range(len(tokens) - n + 1))


FOCUS_SHARE = 0.0  # of the question's content words beyond one (docs/real-models.md)
QUOTES_FOCUS_SHARE = 0.5  # of them, for the offline answer's quotes (docs/grounding.md)
HELD_SHARE = 2 / 3  # of them, for passages that hold the answer however much else is unsupported
NEGATED_SHARE = 1 / 3  # of them, in a passage sentence that negates, for a question that negates


def _whole_number(number: str, text: str) -> bool:
    """Whether ``text`` writes ``number`` as a number of its own or opens one with it: a number
    written from its start (leading zeros aside) and not followed by a digit, so 3.11 is held by
    "3.11.4", 0.95 by "0.95.0", 95 by "95.0", 9 by "09:00"; 95 is no part of "version 0.95.0", of
    2.95, of 1995 nor of "1,950" (a number is also held as ``has_anchor`` holds it: "1,500" for
    1500, "three" for 3). One after a colon is a number of its own (the port of "0.0.0.0:8080")."""
    number = re.sub(r"^0+(?=\d)", "", number)  # "09" is 9
    return re.search(r"(?<!\d)(?<!\d[.,])0*" + re.escape(number) + r"(?!\d|,\d)", text) is not None


def addresses(question: str, passages: Iterable[str], share: float = FOCUS_SHARE,
              names: Iterable[str] = ()) -> bool:
    """Whether ``passages`` (the text an answer's supported sentences rest on) are about what
    ``question`` asks (see the module doc); True when the question gives nothing to check.
    With ``share=HELD_SHARE``, whether they hold the question's focus whatever it names: the
    test for a right answer padded with unsupported sentences (``holds_focus``). ``names``:
    text whose words count towards ``share`` as held, and for nothing else."""
    texts = list(passages)
    joined = "\n".join(texts)
    blob = _flat(joined)
    asked = claims(question)
    if not _negation_held(question, asked.words, texts) or _opposed(question, texts):
        return False
    if any(not (_whole_number(text, joined) or has_anchor(kind, text, joined, blob)) if kind == "number"
           else _flat(text) not in blob and not (kind in _WORDED and has_anchor(kind, text, joined, blob))
           for kind, text in asked.anchors if _flat(text) and kind not in _SPANS):
        return False  # "100 years" is held as "a hundred years" too
    if any(not has_anchor(kind, text, joined, blob) for kind, text in asked.anchors if kind in _SPANS):
        return False  # "third" is held as "3rd" too, "the 1700s" by 1705 or "the 18th century"
    # an anchor's own words ("secrets.compare_digest": secret, compare, digest) are held with it:
    # passages that quote it as code hide them from their words
    named_words = {stem(w) for _, text in asked.anchors for w in words(text)}
    want = [w for w in asked.words if w not in named_words]
    if not want:
        return True
    held = claims(joined).words | claims("\n".join(names)).words
    joined_words = held | {joint for _, _, joint in _joints(joined)}  # "web page" holds "webpage"
    split_words = {w for a, b, joint in _joints(question) if joint in held for w in (a, b)}  # and the other way
    found = sum(1 for w in want
                if w in joined_words or w in split_words or any(_near(w, h) for h in held))
    return found >= max(1, share * len(want))


# "How do I make a field not required?" and "Why doesn't it start?" are answered by how a thing
# is done or why it happens, in words that need not negate, wherever the question asks it ("In
# FastAPI, how do I ..."); "how many" and the like ask a fact
_HOW_WHY = re.compile(r"\b(?:why|how(?!\s+(?:many|much|long|far|old|often|large|big)\b))\b", re.IGNORECASE)
_NON = re.compile(r"\bnon[- ]?(?=[a-z])", re.IGNORECASE)  # "non-binary", "nonprofit", "non original"


# what a passage negates with without "not": "the server lacks ...", "if the header is missing"
_NEGATIVE = re.compile(
    r"\b(?:lack\w*|missing|absent|fail\w*|unable|nothing|nobody|nowhere|exempt\w*|except|instead|prohibit\w*"
    r"|forbid\w*|refus\w*|den(?:y|ied|ies)|prevent\w*|omit\w*|exclud\w*|disabl\w*)\b",
    re.IGNORECASE,
)
_PREFIXES = ("un", "in", "im", "il", "ir", "dis")  # "not valid" is written "invalid"
# Prefixes a question negates a word with that the passages write alone ("insignificant",
# "uninvited", "irrelevant"); "im" and "dis" open too many plain words ("improved", "discovered",
# "dispatch": "proved", "covered", "patch").
_QUESTION_PREFIXES = ("un", "in", "il", "ir")


def _negates(text: str) -> bool:
    return negated_outside_code(text) or _NON.search(text) is not None


def _negates_about(sentence: str, question_words: list[str]) -> bool:
    """Whether a passage's ``sentence`` negates: as a question does, with a word that negates
    without "not" (``_NEGATIVE``), or with one of ``question_words`` under a negative prefix
    ("not valid": "invalid")."""
    if _negates(sentence) or _NEGATIVE.search(sentence):
        return True
    held = set(words(sentence))
    return any(p + w in held for w in question_words if len(w) >= 4 for p in _PREFIXES)


def _unprefixed(question_words: list[str], texts: list[str]) -> set[str]:
    """The words the question negates with a prefix where the passages write them alone,
    without it: "significant" for "insignificant amounts" asked of passages that say
    "significant amounts" and never "insignificant" (the prefix aside, the word has five
    letters or more)."""
    held: set[str] | None = None
    bare = set()
    for w in question_words:
        for p in _QUESTION_PREFIXES:
            if w.startswith(p) and len(w) - len(p) >= 5:
                if held is None:
                    held = {x for text in texts for x in words(text)}
                if w[len(p):] in held and w not in held:
                    bare.add(w[len(p):])
    return bare


def negation_held(question: str, passages: Iterable[str]) -> bool:
    """Whether ``passages`` hold the negation ``question`` asks about (``addresses`` asks it
    first; True when the question gives none to check): which of its tests an unaddressed
    answer failed."""
    return _negation_held(question, claims(question).words, list(passages))


def _negation_held(question: str, asked_words: frozenset[str], texts: list[str]) -> bool:
    """Whether ``texts`` hold the negation a factual question asks about: "What do encrypted
    broadcasts never require?" is not answered from passages that only say what they require.
    A question that negates (and is neither answered yes or no nor a "how" or "why" one) needs a
    sentence of the passages that negates too (``_negates_about``) and holds at least
    ``NEGATED_SHARE`` of the question's content words (one at least); a question that negates
    only with a prefix, a sentence that negates the word itself ("not significant" for
    "insignificant", not a "not" about something else). True for every other question."""
    yes_no = _YES_NO.match(question) or _YES_NO.match(question.rsplit(",", 1)[-1])  # "In FastAPI, is ...?"
    question_words = words(question)
    if yes_no or _HOW_WHY.search(question):
        return True
    bare = set() if _negates(question) else _unprefixed(question_words, texts)
    if not (bare or _negates(question)):
        return True
    need = max(1.0, NEGATED_SHARE * len(asked_words))
    return any(
        piece.kind == "sentence"
        and _negates_about(piece.text, question_words)  # the cheap test first
        and (not bare or not bare.isdisjoint(words(piece.text)))
        and len(asked_words & claims(piece.text).words) >= need
        for text in texts
        for piece in sentences(text, 0)
    )


def _pairs(table: str) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for pair in table.split():
        a, b = pair.split("/")
        out.setdefault(a, set()).add(b)
        out.setdefault(b, set()).add(a)
    return {w: frozenset(o) for w, o in out.items()}


# Words a question is turned into another with by writing the opposite: "Which branch has had
# the least influence?" asked of a passage that says which had the most. Left out, measured on
# the tuning half (docs/real-models.md): pairs one passage often writes of one thing ("the start
# and the end", "deep" and "shallow" rock, a "defeat" and a "victory", who "won" and who "lost" one
# battle).
OPPOSITES = _pairs(
    "most/least more/less more/fewer largest/smallest biggest/smallest larger/smaller bigger/smaller "
    "greater/smaller highest/lowest higher/lower high/low first/last earliest/latest earlier/later "
    "before/after early/late increase/decrease increased/decreased increases/decreases increase/reduce "
    "increased/reduced slowly/rapidly slowly/quickly slow/fast slow/rapid rise/fall gain/loss "
    "strong/weak strongest/weakest longest/shortest long/short maximum/minimum major/minor "
    "success/failure successful/unsuccessful accept/reject accepted/rejected positive/negative "
    "north/south east/west northern/southern eastern/western upper/lower inner/outer oldest/youngest "
    "oldest/newest old/young internal/external inside/outside import/export imports/exports "
    "private/public rich/poor wealthy/poor above/below top/bottom heavy/light hot/cold ancient/modern "
    "allow/prohibit allowed/prohibited same/different common/rare opened/closed true/false agree/disagree "
    "support/oppose supported/opposed best/worst better/worse cheap/expensive wider/narrower large/small "
    "rural/urban men/women male/female minority/majority"
)
_BOUNDS = re.compile(r"\bat (?:most|least)\b", re.IGNORECASE)  # "at most" is no superlative


def _opposed(question: str, texts: list[str]) -> bool:
    """Whether ``texts`` write the opposite of a word the factual ``question`` asks with and
    never the word itself: "least" asked of passages that say "most", "slowly" of "rapidly"
    (``OPPOSITES``). "How" and "why" questions and those answered yes or no are left alone,
    as for a negation: "Is it faster than ...?" is answered "no, slower"."""
    asked = set(words(_BOUNDS.sub(" ", question)))
    if asked.isdisjoint(OPPOSITES) or _YES_NO.match(question) or _YES_NO.match(question.rsplit(",", 1)[-1]) \
            or _HOW_WHY.search(question):
        return False
    held = {w for text in texts for w in words(text)}
    return any(w not in held and not (OPPOSITES[w] & asked) and OPPOSITES[w] & held for w in asked & OPPOSITES.keys())


def opposed(question: str, passages: Iterable[str]) -> bool:
    """Whether ``passages`` write the opposite of a word ``question`` asks with, never the
    word itself (``addresses`` asks it): which of its tests an unaddressed answer failed."""
    return _opposed(question, list(passages))


# a question answered yes or no opens with its verb: "Is ...", "Can I ...", "Does ..."
_YES_NO = re.compile(
    r"\s*(?:is|are|was|were|am|do|does|did|can|could|should|would|will|shall|may|might|must|has|have|had)\b",
    re.IGNORECASE,
)


def says_nothing_new(question: str, sentences: Iterable[str]) -> bool:
    """Whether ``sentences`` (an answer's supported sentences) say nothing ``question`` does
    not: no content word, number or name beyond its own (stems one letter apart count as one),
    and no negation it lacks. False for a question answered yes or no, which an answer may well
    repeat, and when there are no sentences."""
    said_text = " ".join(sentences)
    if not said_text.strip() or _YES_NO.match(question):
        return False
    asked, said = claims(question), claims(said_text)
    if said.negated and not asked.negated:
        return False
    if _letters(said_text) - _letters(question):
        return False  # "B cells and T cells": a letter that names something is no word claims keeps
    asked_anchors = {_flat(text) for _, text in asked.anchors}
    if any(_flat(text) not in asked_anchors for _, text in said.anchors if _flat(text)):
        return False
    return all(in_vocabulary(w, asked.words) for w in said.words)


# a capital letter standing alone names something ("B cells", "type A", "Plan B"); "I" does not,
# nor "A" opening a phrase ("A cell")
_LETTER = re.compile(r"(?<![\w'’.-])([B-HJ-Z]|A(?! [a-z]))(?![\w'’-]|\.\w)")


def _letters(text: str) -> set[str]:
    return set(_LETTER.findall(strip_markers(text)))


def _joints(text: str) -> list[tuple[str, str, str]]:
    """Each two neighbouring words of ``text`` as stems, with the stem of the two written as one
    word: ("web", "page", "webpag")."""
    ws = words(text)
    return [(stem(a), stem(b), stem(a + b)) for a, b in pairwise(ws)]


# anchors a passage holds written another way: "third" as "3rd", "the 1700s" as a year within it
_WORDED = frozenset({"number", "quantity"})  # anchors a passage may write in words ("a hundred")
_SPANS = frozenset({"ordinal", "decade"})


def _near(a: str, b: str) -> bool:
    """Two stems of one word the stemmer left apart (``retry`` and ``retri``, ``policy`` and
    ``polici``): they differ at most in their last letter, and share at least four."""
    n = min(len(a), len(b))
    return n >= 4 and abs(len(a) - len(b)) <= 1 and a[: n - 1] == b[: n - 1]


def cited(sources: Iterable, items: Iterable[EvidenceItem]) -> list[EvidenceItem]:
    """The ones of ``items`` that one of ``sources`` (grounding's narrowed copies,
    crag.grounding.Grounded.sources) was cut from: the whole passages an answer cites, whose
    texts ``addresses`` asks about."""
    spans = [(s.source, s.start_line or 0) for s in sources]
    out = []
    for item in items:
        lo, hi = item.start_line or 0, item.end_line if item.end_line is not None else 1 << 62
        if any(src == item.source and lo <= line <= hi for src, line in spans):
            out.append(item)
    return out


def holds_focus(question: str, chosen: Sequence[EvidenceItem]) -> bool:
    """Whether the passages an answer cites (``chosen``, from ``cited``) hold the question's
    focus, ``HELD_SHARE`` of its content words: the test for a right answer padded with
    unsupported sentences. A passage is about its document's subject, so the words of each
    passage's document name (its file's name and its section's heading,
    crag.grounding.evidence.document_name) count as held, as they do for a sentence's support:
    a passage of guides/function-calling.md under "Function Calling with Inference Providers"
    is about calling functions through Inference Providers wherever it does not say so."""
    return addresses(question, [item.text for item in chosen], HELD_SHARE,
                     names=[document_name(item) for item in chosen])
