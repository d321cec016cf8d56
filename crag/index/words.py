"""Words of English text as crag's lexical features see them: stop words and a light stemmer.

``tokenize`` gives the stemmed content words of a text; ``STOPWORDS`` and ``stem`` are
its parts. The hash embedder and the lexical queries of every store use them.
"""

from __future__ import annotations

import re

__all__ = ["STOPWORDS", "WORD", "stem", "tokenize"]

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves also may might must shall using use used via per etc e g eg
    ie i.e let lets s t don doesn isn aren wasn weren won can't cannot
    """.split()
)

WORD = re.compile(r"[^\W_]+")


def stem(word: str) -> str:
    """A light English suffix stripper: plurals, -ing, -ed (``tokens`` → ``token``)."""
    if word[-1:] not in ("s", "g", "d"):  # no suffix this stripper knows (the common case)
        return word
    n = len(word)
    if n <= 3 or word.isdigit():
        return word
    if word.endswith("ies") and n > 4:
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
        n -= 1
    if word.endswith("ing") and n > 5:
        return word[:-3]
    if word.endswith("ed") and n > 4:
        return word[:-2]
    return word


_stem_cache: dict[str, str | None] = {}


def tokenize(text: str) -> list[str]:
    """Stemmed content words of ``text`` in order (stop words dropped)."""
    out = []
    cache = _stem_cache
    for word in WORD.findall(text.lower()):
        s = cache.get(word, "")
        if s == "":
            s = None if word in STOPWORDS else stem(word)
            if len(cache) < 500_000:
                cache[word] = s
        if s is not None:
            out.append(s)
    return out

