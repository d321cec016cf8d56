"""The local hashing embedder: numpy only, no network (see ``crag.index.embedders``)."""

from __future__ import annotations

import functools
import threading
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..text import STOPWORDS, WORD, stem

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BIGRAM_WEIGHT", "DEFAULT_HASH_DIM", "HASH_VERSION", "HashEmbedder"]

HASH_VERSION = 1
# Chosen by benchmarks/retrieval.py and benchmarks/store_scale.py (docs/retrieval.md): hybrid
# search ranks the shared questions at 1,008 dimensions as at 1,024 and 2,048, and 1,008 is
# the most at which two vectors fit one page of a pgvector index (4 bytes a dimension, 16 of
# headers and 4 of line pointer each, in 8,160 bytes): the PostgreSQL store's vector index is
# half the size it is at 1,024, and a search reads half the pages (docs/postgresql.md).
DEFAULT_HASH_DIM = 1008
BIGRAM_WEIGHT = 0.5

# Lower-cased UTF-8 bytes -> the same bytes for ASCII letters and digits and for every
# non-ASCII byte, a space for every other ASCII byte (punctuation, ``_``, whitespace).
_WORD_BYTES = bytes(b if (48 <= b <= 57 or 97 <= b <= 122 or b >= 128) else 32 for b in range(256))

_MAX_CACHED_WORDS = 1_000_000
_BIGRAM_FLAG = 1 << 39
_SIGN_BIT = 1 << 38
_KEY_BITS = 40


def _stem_v1(word: str) -> str:
    """``crag.text.stem`` as version 1 of this embedder hashed words, so that an index it built
    keeps matching its queries: "retried" was "retri" (now "retry", as "retries" is)."""
    if word.endswith("ied") and len(word) > 4:
        return word[:-2]
    return stem(word)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 arrays: a stable, well-spread 64-bit hash."""
    import numpy as np

    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


# Words of at most this many ASCII bytes are looked up in bulk (see HashEmbedder).
_PACKED_BYTES = 16


@functools.cache
def _byte_masks() -> Any:
    """``masks[k]`` keeps the low ``k`` bytes of a uint64."""
    import numpy as np

    return np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)


class _Vocabulary:
    """Packed short words -> codes: an open-addressing hash table in numpy arrays.

    A word is stored as its exact bytes ``(lo, hi)`` (``lo`` is never 0 for a word, so 0
    marks an empty slot) in the slot its hash picks, probing linearly; a lookup compares
    the bytes, so two words sharing a hash are never confused.
    """

    def __init__(self, capacity: int = 1 << 15) -> None:
        import numpy as np

        self.mask = capacity - 1
        self.lo = np.zeros(capacity, dtype=np.uint64)
        self.hi = np.zeros(capacity, dtype=np.uint64)
        self.codes = np.zeros(capacity, dtype=np.int64)
        self.size = 0

    def lookup(self, keys: Any, lo: Any, hi: Any) -> tuple[Any, Any]:
        """(codes, found) for each packed word (codes are meaningless where not found)."""
        import numpy as np

        slots = (keys & np.uint64(self.mask)).astype(np.intp)
        stored = self.lo[slots]
        found = (stored == lo) & (self.hi[slots] == hi)
        codes = self.codes[slots]
        pending = np.flatnonzero(~found & (stored != 0))  # a slot taken by another word: probe on
        while pending.size:
            s = (slots[pending] + 1) & self.mask
            slots[pending] = s
            stored = self.lo[s]
            hit = (stored == lo[pending]) & (self.hi[s] == hi[pending])
            done = pending[hit]
            codes[done] = self.codes[s[hit]]
            found[done] = True
            pending = pending[~hit & (stored != 0)]
        return codes, found

    def insert(self, keys: Any, lo: Any, hi: Any, codes: Any) -> None:
        """Store words known to be absent (each once)."""
        import numpy as np

        if 2 * (self.size + keys.size) > self.lo.size:
            self._grow(2 * (self.size + keys.size))
        slots = (keys & np.uint64(self.mask)).astype(np.intp)
        pending = np.arange(keys.size)
        while pending.size:
            s = slots[pending]
            free = self.lo[s] == 0
            # Of the words wanting the same free slot, the first takes it.
            taken, first = np.unique(s[free], return_index=True)
            winners = pending[free][first]
            self.lo[taken] = lo[winners]
            self.hi[taken] = hi[winners]
            self.codes[taken] = codes[winners]
            placed = np.zeros(keys.size, dtype=bool)
            placed[winners] = True
            pending = pending[~placed[pending]]
            moved = pending[self.lo[slots[pending]] != 0]
            slots[moved] = (slots[moved] + 1) & self.mask
        self.size += keys.size

    def _grow(self, need: int) -> None:
        import numpy as np

        used = self.lo != 0
        old_lo, old_hi, old_codes = self.lo[used], self.hi[used], self.codes[used]
        capacity = self.lo.size
        while capacity < need:
            capacity *= 2
        self.mask = capacity - 1
        self.lo = np.zeros(capacity, dtype=np.uint64)
        self.hi = np.zeros(capacity, dtype=np.uint64)
        self.codes = np.zeros(capacity, dtype=np.int64)
        self.size = 0
        self.insert(_word_keys(old_lo, old_hi), old_lo, old_hi, old_codes)


def _word_keys(lo: Any, hi: Any) -> Any:
    """The hash of packed words."""
    return _mix(lo ^ _mix(hi))


class HashEmbedder:
    """Signed feature hashing of unigrams and bigrams into ``dim`` dimensions (numpy only).

    Words are found and looked up in bulk: a batch of texts becomes one byte buffer whose
    words are located with numpy, and every word of at most 16 ASCII bytes (nearly all of
    them) is packed into two integers and looked up in a hash table of the words seen so
    far, compared byte for byte; only new words, longer ones and those
    holding non-ASCII characters cost Python work. The vectors are exactly those of the
    per-word definition in the module docstring.

    Thread-safe: the shared state is a word → code cache whose entries never change, and
    the vocabulary, used under a lock.
    """

    relates_words = False  # vectors of texts without a common word are unrelated (crag.index.search)

    def __init__(self, dim: int = DEFAULT_HASH_DIM, bigram_weight: float = BIGRAM_WEIGHT) -> None:
        if not 16 <= dim <= (1 << 24):
            raise ValueError(f"hash embedder dimension must be in [16, 2**24], got {dim}")
        self.dim = dim
        self.bigram_weight = bigram_weight
        suffix = "" if bigram_weight == BIGRAM_WEIGHT else f":b{bigram_weight:g}"
        self.name = f"hash:v{HASH_VERSION}:{dim}{suffix}"
        self._codes: dict[str | bytes, int] = {}  # word -> crc32 of its stem, or -1 for a stop word
        self._pieces: dict[bytes, list[int]] = {}  # long or non-ASCII pieces -> their words' codes
        self._vocab: _Vocabulary | None = None  # short ASCII words -> codes
        self._lock = threading.Lock()  # for _vocab

    @staticmethod
    def _code(word: str | bytes) -> int:
        """CRC-32 of the word's stem, or -1 for a stop word."""
        if isinstance(word, bytes):
            word = word.decode("ascii")
        return -1 if word in STOPWORDS else zlib.crc32(_stem_v1(word).encode("utf-8"))

    def _cached_code(self, word: str | bytes) -> int:
        cache = self._codes
        code = cache.get(word)
        if code is None:
            if len(cache) > _MAX_CACHED_WORDS:
                cache = self._codes = {}
            code = cache[word] = self._code(word)
        return code

    def _piece_codes(self, piece: bytes) -> list[int]:
        """Codes of the words of a long or non-ASCII piece of text (cached)."""
        words = [piece] if piece.isascii() else WORD.findall(piece.decode("utf-8", "surrogatepass"))
        codes = [self._cached_code(w) for w in words]
        pieces = self._pieces
        if len(pieces) > _MAX_CACHED_WORDS:
            pieces = self._pieces = {}
        pieces[piece] = codes
        return codes

    def _word_codes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(codes, rows): the code of every word of the texts in order, and its text's index.

        The same words as ``WORD.findall(text.lower())``: ASCII punctuation and spaces
        always end a word, so after ``bytes.translate`` turns them into spaces the words
        are the runs of other bytes, except that a run holding non-ASCII bytes goes
        through the regex (it may hold letters, or symbols that end words).
        """
        import numpy as np

        parts = [text.lower().encode("utf-8", "surrogatepass") for text in texts]
        joined = b" ".join(parts).translate(_WORD_BYTES)
        size = len(joined)
        empty = np.zeros(0, dtype=np.int64)
        if not size:
            return empty, empty
        data = np.frombuffer(joined + bytes(24), dtype=np.uint8)
        is_word = np.zeros(size + 2, dtype=bool)
        np.not_equal(data[:size], 32, out=is_word[1:-1])
        edges = np.flatnonzero(is_word[1:] != is_word[:-1])
        starts, ends = edges[0::2], edges[1::2]
        if not starts.size:
            return empty, empty
        lengths = ends - starts
        text_starts = np.cumsum([0] + [len(p) + 1 for p in parts[:-1]])
        seg_rows = np.searchsorted(text_starts, starts, side="right") - 1
        slow = lengths > _PACKED_BYTES
        if not joined.isascii():
            high = np.flatnonzero(data[:size] >= 128)
            slow[np.searchsorted(starts, high, side="right") - 1] = True
        fast = np.flatnonzero(~slow)
        counts = np.ones(starts.size, dtype=np.int64)
        slow_codes: list[tuple[int, list[int]]] = []
        if fast.size < starts.size:
            pieces = self._pieces
            for j, s, e in zip(*(a.tolist() for a in (np.flatnonzero(slow), starts[slow], ends[slow]))):
                piece = joined[s:e]
                cs = pieces.get(piece)
                if cs is None:
                    cs = self._piece_codes(piece)
                slow_codes.append((j, cs))
                counts[j] = len(cs)
        positions = np.cumsum(counts) - counts
        codes = np.empty(int(positions[-1] + counts[-1]), dtype=np.int64)
        if fast.size:
            codes[positions[fast]] = self._short_codes(joined, data, starts[fast], lengths[fast])
        for j, cs in slow_codes:
            if cs:
                codes[positions[j] : positions[j] + len(cs)] = cs
        return codes, np.repeat(seg_rows, counts)

    def _short_codes(self, joined: bytes, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Codes of the ASCII words of at most 16 bytes at ``starts`` (vocabulary lookup)."""
        import numpy as np

        # Element i of `packed` is bytes i..i+7 read as a little-endian integer; masking the
        # bytes past the word's end leaves a word's exact bytes in (lo, hi).
        packed = np.ndarray(shape=(data.size - 7,), dtype="<u8", buffer=data, strides=(1,))
        masks = _byte_masks()
        lo = packed[starts] & masks[np.minimum(lengths, 8)]
        hi = packed[starts + 8] & masks[np.clip(lengths - 8, 0, 8)]
        keys = _word_keys(lo, hi)
        with self._lock:
            vocab = self._vocab
            if vocab is None or vocab.size > _MAX_CACHED_WORDS:
                vocab = self._vocab = _Vocabulary()
            codes, found = vocab.lookup(keys, lo, hi)
            if found.all():
                return codes
            missing = np.flatnonzero(~found)
            new_keys, first = np.unique(keys[missing], return_index=True)
            first = missing[first]
            code = self._code
            new_codes = np.fromiter(
                (code(joined[s : s + n]) for s, n in zip(starts[first].tolist(), lengths[first].tolist())),
                dtype=np.int64,
                count=new_keys.size,
            )
            vocab.insert(new_keys, lo[first], hi[first], new_codes)
            codes_again, found = vocab.lookup(keys[missing], lo[missing], hi[missing])
        codes[missing] = codes_again
        for i in missing[~found].tolist():  # two words sharing a hash: the slow way
            codes[i] = self._cached_code(joined[starts[i] : starts[i] + lengths[i]])
        return codes

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        n = len(texts)
        dim = self.dim
        out = np.zeros((n, dim), dtype=np.float32)
        if n == 0:
            return out
        codes_arr, rows = self._word_codes(texts)
        if not codes_arr.size:
            return out
        rows = rows.astype(np.uint64)
        keep = codes_arr >= 0
        uni = codes_arr[keep].astype(np.uint64)
        rows = rows[keep]
        if uni.size == 0:
            return out
        low = np.uint64((1 << _KEY_BITS) - 1)
        feats = [_mix(uni) & low & ~np.uint64(_BIGRAM_FLAG)]
        feat_rows = [rows]
        if self.bigram_weight and uni.size > 1:
            same = rows[1:] == rows[:-1]
            pairs = ((uni[:-1] << np.uint64(32)) | uni[1:])[same]
            feats.append((_mix(pairs) & low) | np.uint64(_BIGRAM_FLAG))
            feat_rows.append(rows[1:][same])
        keys = (np.concatenate(feat_rows) << np.uint64(_KEY_BITS)) | np.concatenate(feats)
        keys.sort()  # np.unique(keys, return_counts=True), without its overheads
        first = np.empty(keys.size, dtype=bool)
        first[0] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        counts = np.diff(starts, append=keys.size)
        keys = keys[starts]
        weights = 1.0 + np.log(counts.astype(np.float32))
        bigram = (keys & np.uint64(_BIGRAM_FLAG)) != 0
        weights[bigram] *= np.float32(self.bigram_weight)
        negative = (keys & np.uint64(_SIGN_BIT)) != 0
        weights[negative] *= np.float32(-1.0)
        # The feature's slot: its low 32 bits modulo ``dim`` (for a power of two, its low bits).
        slots = ((keys & np.uint64(0xFFFFFFFF)) % np.uint64(dim)).astype(np.int64)
        key_rows = (keys >> np.uint64(_KEY_BITS)).astype(np.int64)
        np.add.at(out.reshape(-1), key_rows * dim + slots, weights.astype(np.float32))
        # np.linalg.norm(out, axis=1) without its copy of `out`: the same float32 sums. An
        # all-zero row is divided by 1 (no mask to test on every element).
        norms = np.sqrt(np.add.reduce(out * out, axis=1, keepdims=True))
        norms[norms == 0] = 1.0
        out /= norms
        return out


