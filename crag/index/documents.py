"""What every store indexes for a chunk, and the lexical query every store runs.

Both stores embed and full-text index the same text for a chunk (``embed_text``: the
file's title words, its heading path, then its text) and turn a user's query into the same
terms (``query_terms``), so that they rank alike. ``fts_query`` is the SQLite FTS5 form of
those terms. ``chunker_id`` names the chunking a store records; ``REINDEX`` is the advice
given when an index was built with another embedder.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence

from ..errors import EmbedderMismatchError
from ..text import STOPWORDS
from .chunker import CHUNKER_VERSION

__all__ = ["REINDEX", "chunker_id", "dim_mismatch", "embed_text", "embedder_mismatch", "fts_match", "fts_phrase", "fts_query", "query_terms", "reindex", "title_words"]

REINDEX = "run `python -m crag index PATH` to re-index"


def embedder_mismatch(built_with: str, configured: str, roots: Sequence[str], location: str | None) -> EmbedderMismatchError:
    """The one error for an index built with another embedder than the configured one."""
    return EmbedderMismatchError(
        f"index was built with {built_with}, configured embedder is {configured}: {reindex(roots)}", location
    )


def dim_mismatch(
    embedder: str, got: int, held: int, roots: Sequence[str], location: str | None
) -> EmbedderMismatchError:
    """The error for an embedder whose vectors are no longer as long as the index's (another
    model under the same name): another embedder, so its advice names the roots as well."""
    return EmbedderMismatchError(
        f"the embedder {embedder} returned {got}-dimensional vectors, the index holds {held}: {reindex(roots)}",
        location,
    )


def reindex(roots: Sequence[str]) -> str:
    """The advice to re-index, naming the index's roots (relative to the working directory)."""
    import shlex

    from .discover import relative_label

    if not roots:
        return REINDEX
    labels = (relative_label(r) for r in roots if os.path.lexists(r))
    paths = " ".join(shlex.quote(f"./{p}" if p.startswith("-") else p) for p in labels)  # "-docs" is no option
    return f"run `python -m crag index {paths}` to re-index" if paths else REINDEX

_TITLE_SPLIT = re.compile(r"[\\/_\-. ]+")


def chunker_id(max_tokens: int, min_tokens: int) -> str:
    """The chunking settings as the store records them."""
    return f"v{CHUNKER_VERSION}:{max_tokens}:{min_tokens}"


def query_terms(text: str, max_terms: int = 32) -> list[str]:
    """The distinct lower-case words of ``text`` that are not stop words, in order.

    Words are runs of letters and digits, so no operator or quote of any query language
    can reach a store. A query written decomposed (NFD: a file name copied on macOS, where
    ``가`` is two jamo and ``ή`` an ``η`` and an accent) has its composed words first, which
    documents written composed hold, then its words as written, which documents written
    decomposed hold.
    """
    terms: list[str] = []
    seen = set()
    composed = unicodedata.normalize("NFC", text)
    written = re.findall(r"[^\W_]+", text.lower())
    found = written if composed == text else re.findall(r"[^\W_]+", composed.lower()) + written
    for word in found:
        if word in STOPWORDS or word in seen:
            continue
        seen.add(word)
        terms.append(word)
        if len(terms) >= max_terms:
            break
    return terms


def fts_query(text: str, max_terms: int = 32) -> str | None:
    """An FTS5 MATCH expression for arbitrary user text: quoted terms joined by OR.

    Terms are runs of letters and digits (so no quote, operator or column filter can reach
    FTS5), stop words are dropped, and each term is double-quoted. None when nothing is left.
    """
    terms = query_terms(text, max_terms)
    return fts_match(terms, "any") if terms else None


def fts_phrase(term: str) -> str:
    """One term as an FTS5 string (double-quoted)."""
    return '"' + term.replace('"', '""') + '"'


def fts_match(terms: Sequence[str], mode: str = "any") -> str:
    """An FTS5 MATCH expression for rows holding any (``mode`` "any") or all ("all") of ``terms``."""
    return (" AND " if mode == "all" else " OR ").join(fts_phrase(t) for t in terms)


def title_words(path: str, root: str) -> str:
    """The words of a file's path below its root: what its chunks are titled with."""
    if path == root:
        rel = os.path.basename(path)
    elif path.startswith(root) and path[len(root) : len(root) + 1] == os.sep and root != os.sep:
        rel = path[len(root) + 1 :]  # what relpath gives for a normalised path under root, cheaply
    else:
        rel = os.path.relpath(path, root)
    stem = os.path.splitext(rel)[0]
    return " ".join(w for w in _TITLE_SPLIT.split(stem) if w)


def embed_text(title: str, heading: str, text: str) -> str:
    """What is embedded and lexically indexed for a chunk: where it is, then what it says."""
    return f"{title}\n{heading}\n{text}"
