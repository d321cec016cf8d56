"""Bounded full-text ranking: which query terms a store ranks with, so that a query costs
about the same on a large knowledge base as on a small one.

Both stores rank chunks (and files) by BM25 over the query's terms (``query_terms``), and
the cost of a BM25 ranking grows with the rows it scores: every row holding any term, and,
for the inverse document frequencies, every row of every term. A question's rare words
match a few rows; a frequent word ("history", "system") matches a large share of a
million chunks, and would cost hundreds of milliseconds for the least useful part of
the ranking (its weight, the IDF, is the smallest).

``plan(dfs, budget)`` decides from each term's document frequency (counted by the store up
to ``budget + 1``, so counting is bounded too):

* terms are taken rarest first while the rows they match add up to at most ``budget``:
  those terms select the rows ranked (``ANY``: every row holding any of them), and every
  term of the query scores them (the others are ``scored_only``). The ranking is the
  BM25 of every term, exactly, over the rows holding at least one selecting term; a row
  holding only frequent terms is not ranked (the MaxScore bound of information retrieval:
  frequent terms weigh little, so such a row rarely outranks one holding a rare term).
  Below ``budget`` rows per term total, which covers every query on a knowledge base of
  up to ``budget`` chunks, every term selects and this is BM25 over every row;
* when even the rarest term matches more than ``budget`` rows (a query of frequent words
  only), the ranking is BM25 over the rows holding every term (``ALL``); the store counts
  those too, and when they are still more than ``budget`` it scores the ``budget`` of them
  indexed first.

Terms no row holds are dropped, and of the rest the ``MAX_TERMS`` rarest are kept (a
pasted page of text: its one word a document holds counts wherever it stands, and its
frequent words, which would weigh least, are the ones left out). The stores' ``lexical_ranking`` and ``file_ranking``
follow the plan with their own budgets (``CHUNK_BUDGET``, ``FILE_BUDGET``). The file
ranking of a hybrid search ranks only the candidates' files, and for a query of frequent
words only it ranks none: its cost is the IDF of those words, read over every file that
holds them (700 ms for "one" at a million chunks, in 90% of the files), and it could
not tell the candidates' files apart by words nearly every file holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

__all__ = ["ALL", "ANY", "CHUNK_BUDGET", "FILE_BUDGET", "MAX_TERMS", "QUERY_WORDS", "RESCORED", "LexicalPlan", "plan"]

ANY = "any"
ALL = "all"
# Rows a ranking scores at most (measured by benchmarks/store_scale.py: about 1 µs a row
# in SQLite's FTS5 on this machine).
CHUNK_BUDGET = 10_000
FILE_BUDGET = 2_000
# PostgreSQL: the rows of the selecting terms that the frequent terms score (the best by the
# selecting terms); each costs an index lookup a frequent term.
RESCORED = 1_000
# Terms a ranking uses at most: the rarest of the query's terms that some row holds.
MAX_TERMS = 32
# Distinct words of a query whose rows a store counts at most (about 10 µs each in SQLite),
# the first ones: every word of a 10,000-word query, and more.
QUERY_WORDS = 20_000


@frozen
class LexicalPlan:
    """The terms that select the rows a ranking scores (``ANY``: rows holding any; ``ALL``: rows
    holding every one), and the terms that only score them."""

    terms: tuple[str, ...]
    mode: str = ANY
    scored_only: tuple[str, ...] = ()


def plan(dfs: Sequence[tuple[str, int]], budget: int) -> LexicalPlan:
    """The plan for terms with their document frequencies (capped at ``budget + 1``), in query order."""
    present = [(t, df) for t, df in dfs if df > 0]
    if not present:
        return LexicalPlan(())
    if len(present) > MAX_TERMS:
        rarest = {t for t, _ in sorted(present, key=lambda p: p[1])[:MAX_TERMS]}  # stable: earlier words first
        present = [(t, df) for t, df in present if t in rarest]
    by_rarity = sorted(present, key=lambda p: p[1])
    taken: list[str] = []
    rows = 0
    for term, df in by_rarity:
        if rows + df > budget:
            break
        taken.append(term)
        rows += df
    if taken:
        keep = set(taken)
        return LexicalPlan(
            tuple(t for t, _ in present if t in keep), ANY, tuple(t for t, _ in present if t not in keep)
        )
    return LexicalPlan(tuple(t for t, _ in present), ALL)
