"""What a question names that the evidence must hold for the question to be answered.

A question about ``HTTP/3``, ``gRPC`` or ``Terraform`` is not answered by passages that never
mention it, however well the rest of the question matches them: retrieval finds the nearest
passages there are, and a model asked to answer from them writes what the question expects.
``named`` picks the terms a question names: a token with a letter and a digit (``HTTP/3``,
``OAuth2``), with a capital after its first letter (``gRPC``, ``TypeScript``, ``JWT``), or a
capitalised word that does not open a sentence (``Terraform``); consecutive plain
capitalised words are one name (``Apple Watch``). ``missing`` is the named terms no evidence item holds,
compared without case, spaces and punctuation (``Hugging Face`` holds ``huggingface``).

Measured on the project's documentation questions (docs/real-models.md, "Questions the
knowledge base cannot answer"): no answerable question had a named term missing from its
top five passages; seven of the eight unanswerable ones did.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["missing", "named"]

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9+#./_-]*[A-Za-z0-9+#]|[A-Za-z0-9]")
# capitalised words that name nothing: how questions and sentences open
_PLAIN = frozenset(
    "I How What Which Where When Why Who Whose Can Could Do Does Did Is Are Was Were Should Would "
    "Will Shall May Might Must Has Have Had The A An My Our Your Its Their This That These Those "
    "In On At For With To Of And Or But If Not No Yes Please Is Any Some".split()
)
_NOT_WORD = re.compile(r"[^0-9a-z]+")


def _flat(text: str) -> str:
    return _NOT_WORD.sub("", text.lower())


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


def missing(question: str, texts: Iterable[str]) -> list[str]:
    """The terms ``question`` names that none of ``texts`` holds."""
    terms = named(question)
    if not terms:
        return []
    blob = _flat("\n".join(texts))
    return [t for t in terms if _flat(t) and _flat(t) not in blob]
