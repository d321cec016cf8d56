"""Counting tiktoken tokens of many lines at once, for the chunker (``crag.index.chunker``).

``TokenCounter`` counts texts exactly and, in one pass over a file, the tokens each of its
lines takes inside that file (see its docstring); ``token_counter()`` makes one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["TokenCounter", "token_counter"]


class TokenCounter:
    """Counts tiktoken tokens: ``counter(texts)`` exactly, ``counter.line_counts(lines)`` in one pass.

    ``line_counts`` encodes the lines joined by newlines once (tiktoken releases the GIL
    while it encodes, so several files can be counted in parallel threads) and gives each
    line the tokens that start in it, newline included: a range of lines then costs the
    sum of its lines' counts, which is the tokens it takes inside its file. That differs
    from encoding the range alone by at most a token or two at its edges (where tiktoken's
    pre-tokenizer joins a line's final punctuation or spaces with the newline after it),
    which is why the chunker checks the exact count of a chunk close to its budget.
    """

    def __init__(self, encoding: str | None = None) -> None:
        from ..llm.tokens import DEFAULT_ENCODING, get_encoding

        self.encoding = get_encoding(encoding or DEFAULT_ENCODING)
        self._encode = self.encoding.encode_ordinary

    def __call__(self, texts: Sequence[str]) -> list[int]:
        from ..llm.tokens import in_pieces

        encode = self._encode
        return [sum(map(len, in_pieces(encode, t))) for t in texts]

    def _tokens(self, text: str) -> Any:
        import numpy as np

        from ..llm.tokens import in_pieces

        core = getattr(self.encoding, "_core_bpe", None)
        to_buffer = getattr(core, "encode_to_tiktoken_buffer", None)
        if to_buffer is not None:
            # encode_ordinary's tokens without a Python list (an empty allowed-special set
            # makes encode() ordinary); the GIL is released while it runs.
            parts = [np.frombuffer(b, dtype=np.uint32) for b in in_pieces(lambda t: to_buffer(t, set()), text)]
        else:  # pragma: no cover
            parts = [np.asarray(p, dtype=np.int64) for p in in_pieces(self._encode, text)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def line_counts(self, lines: Sequence[str]) -> list[int]:
        """Tokens of each line, newline included, as counted in the whole text (see above)."""
        return self.line_counts_many([lines])[0]

    def line_counts_many(
        self, files: Sequence[Sequence[str]], texts: Sequence[str | None] | None = None
    ) -> list[list[int]]:
        """``[line_counts(lines) for lines in files]``, with far fewer calls into tiktoken.

        ``texts[i]``, when given, is the text ``files[i]`` was split from (it saves joining
        the lines again). Texts are encoded back to back in one call wherever that cannot
        change a token: tiktoken's pre-tokenizer only carries a piece across a newline
        into more newlines, spaces or slashes, so a text that starts with anything else is
        encoded exactly as on its own after a text that ends with a newline (each one
        here does).
        """
        out: list[list[int]] = [[] for _ in files]
        run: list[int] = []
        run_texts: list[str] = []
        run_chars = 0
        for i, lines in enumerate(files):
            if not lines:
                continue
            text = texts[i] if texts is not None else None
            if text is None or not text.endswith("\n"):
                text = "\n".join(lines) + "\n"
            first = text[0]
            if run and (first.isspace() or first == "/" or run_chars >= _RUN_CHARS):
                self._count_run(run, run_texts, files, out)
                run, run_texts, run_chars = [], [], 0
            run.append(i)
            run_texts.append(text)
            run_chars += len(text)
        if run:
            self._count_run(run, run_texts, files, out)
        return out

    def _count_run(
        self, run: list[int], run_texts: list[str], files: Sequence[Sequence[str]], out: list[list[int]]
    ) -> None:
        import numpy as np

        joined = "".join(run_texts)
        try:
            data = joined.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: count each line on its own
            for i in run:
                out[i] = [c + 1 for c in self(files[i])]
            return
        ends = np.cumsum(_token_byte_lengths(self.encoding.name)[self._tokens(joined)])
        if not len(ends) or int(ends[-1]) != len(data):  # pragma: no cover - cannot happen with BPE
            for i in run:
                out[i] = [c + 1 for c in self(files[i])]
            return
        # Tokens start at 0 and at each token's end; line k ends with the newline at byte
        # newlines[k]. The tokens starting at or before it, less those before line k.
        newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        upto = np.searchsorted(ends, newlines, side="right") + 1
        counts = np.diff(upto, prepend=0).tolist()
        pos = 0
        for i in run:
            n = len(files[i])
            out[i] = counts[pos : pos + n]
            pos += n


@functools.cache
def _token_byte_lengths(encoding: str) -> Any:
    """The UTF-8 byte length of every token of an encoding, indexed by token id."""
    import numpy as np

    from ..llm.tokens import get_encoding

    enc = get_encoding(encoding)
    ranks = getattr(enc, "_mergeable_ranks", None)
    if isinstance(ranks, dict) and ranks:
        table = np.zeros(max(enc.n_vocab, max(ranks.values()) + 1), dtype=np.int32)
        table[np.fromiter(ranks.values(), dtype=np.int64, count=len(ranks))] = np.fromiter(
            map(len, ranks), dtype=np.int32, count=len(ranks)
        )
        return table
    table = np.zeros(enc.n_vocab, dtype=np.int32)  # pragma: no cover - tiktoken has always had _mergeable_ranks
    for i in range(enc.n_vocab):  # pragma: no cover
        try:
            table[i] = len(enc.decode_single_token_bytes(i))
        except KeyError:
            pass
    return table  # pragma: no cover


# At most this many characters are encoded in one call of line_counts_many.
_RUN_CHARS = 1 << 20


def token_counter(encoding: str | None = None) -> TokenCounter:
    """A ``TokenCounter``: ``count(texts)`` counts many texts at once with tiktoken (no network)."""
    return TokenCounter(encoding)
