"""Embedders behind the ``Embedder`` port: a local hashing embedder and an OpenAI one.

``HashEmbedder`` needs nothing but numpy and no network. A text becomes features (word
unigrams and adjacent-word bigrams, lower-cased, English stop words removed, lightly
stemmed), each weighted by sublinear term frequency (1 + ln tf; bigrams at
``BIGRAM_WEIGHT``), then signed-hashed into ``dim`` dimensions with CRC-32 (stable across
processes and machines, unlike Python's salted ``hash``) and normalised to unit length.
It deliberately uses no corpus statistics (IDF): a vector depends on its text alone, so
an incremental update never has to re-embed unchanged files. Corpus-level term weighting
comes from the BM25 half of the hybrid search instead. Its ``name`` records the feature
scheme version and the dimension (``hash:v1:2048``), so an index built with another
scheme or size is detected as a mismatch.

``OpenAIEmbedder`` calls ``settings.embedding_model`` through the openai SDK's embeddings
API (imported lazily): batched, a few requests in flight, retried by the SDK on 429, 5xx,
timeouts and dropped connections (``KB_AGENT_LLM_MAX_RETRIES``), and its failures
translated into ``LLMError`` at this one boundary. Its ``name`` is ``openai:<model>``.

``make_embedder(settings)`` picks one from ``KB_AGENT_EMBEDDER``.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LLMError, LLMTimeoutError

if TYPE_CHECKING:
    import numpy as np

    from ..config import Settings

__all__ = [
    "DEFAULT_HASH_DIM",
    "HashEmbedder",
    "OpenAIEmbedder",
    "make_embedder",
    "stem",
    "tokenize",
]

HASH_VERSION = 1
# Chosen by benchmarks/retrieval.py: see benchmarks/results/retrieval.md.
DEFAULT_HASH_DIM = 2048
BIGRAM_WEIGHT = 0.5

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

_WORD = re.compile(r"[^\W_]+")


def stem(word: str) -> str:
    """A light English suffix stripper: plurals, -ing, -ed (``tokens`` → ``token``)."""
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
    for word in _WORD.findall(text.lower()):
        s = cache.get(word, "")
        if s == "":
            s = None if word in STOPWORDS else stem(word)
            if len(cache) < 500_000:
                cache[word] = s
        if s is not None:
            out.append(s)
    return out


_MAX_CACHED_WORDS = 1_000_000
_BIGRAM_FLAG = 1 << 39
_SIGN_BIT = 1 << 38
_KEY_BITS = 40


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 arrays: a stable, well-spread 64-bit hash."""
    import numpy as np

    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class HashEmbedder:
    """Signed feature hashing of unigrams and bigrams into ``dim`` dimensions (numpy only).

    Thread-safe: the only shared state is a word → code cache whose entries never change.
    """

    def __init__(self, dim: int = DEFAULT_HASH_DIM, bigram_weight: float = BIGRAM_WEIGHT) -> None:
        if dim < 16 or dim & (dim - 1) or dim > (1 << 24):
            raise ValueError(f"hash embedder dimension must be a power of two in [16, 2**24], got {dim}")
        self.dim = dim
        self.bigram_weight = bigram_weight
        suffix = "" if bigram_weight == BIGRAM_WEIGHT else f":b{bigram_weight:g}"
        self.name = f"hash:v{HASH_VERSION}:{dim}{suffix}"
        self._codes: dict[str, int] = {}  # word -> crc32 of its stem, or -1 for a stop word

    @staticmethod
    def _code(word: str) -> int:
        """CRC-32 of the word's stem, or -1 for a stop word."""
        return -1 if word in STOPWORDS else zlib.crc32(stem(word).encode("utf-8"))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        n = len(texts)
        dim = self.dim
        out = np.zeros((n, dim), dtype=np.float32)
        if n == 0:
            return out
        findall = _WORD.findall
        texts_words = [findall(text.lower()) for text in texts]
        cache = self._codes
        if len(cache) > _MAX_CACHED_WORDS:
            cache = self._codes = {}
        code = self._code
        for words in texts_words:
            for w in set(words).difference(cache):
                cache[w] = code(w)
        lookup = cache.__getitem__
        flat: list[int] = []
        lengths = []
        for words in texts_words:
            flat.extend(map(lookup, words))
            lengths.append(len(words))
        if not flat:
            return out
        codes_arr = np.asarray(flat, dtype=np.int64)
        rows = np.repeat(np.arange(n, dtype=np.uint64), lengths)
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
        keys, counts = np.unique(keys, return_counts=True)
        weights = 1.0 + np.log(counts.astype(np.float32))
        bigram = (keys & np.uint64(_BIGRAM_FLAG)) != 0
        weights[bigram] *= np.float32(self.bigram_weight)
        negative = (keys & np.uint64(_SIGN_BIT)) != 0
        weights[negative] *= np.float32(-1.0)
        slots = (keys & np.uint64(dim - 1)).astype(np.int64)
        key_rows = (keys >> np.uint64(_KEY_BITS)).astype(np.int64)
        np.add.at(out.reshape(-1), key_rows * dim + slots, weights.astype(np.float32))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


# Dimensions of well-known models, so that ``dim`` needs no request.
_KNOWN_DIMS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
_MAX_INPUT_TOKENS = 8000  # the embeddings API refuses inputs above 8191 tokens


class OpenAIEmbedder:
    """``settings.embedding_model`` through the openai SDK's embeddings API."""

    def __init__(
        self,
        model: str,
        api_key: str = "",
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        batch_size: int = 128,
        max_parallel: int = 4,
        client: Any = None,
    ) -> None:
        self.model = model
        self.name = f"openai:{model}"
        self._api_key = api_key
        self._base_url = base_url
        self._timeout = timeout
        self._max_retries = max_retries
        self.batch_size = batch_size
        self.max_parallel = max_parallel
        self._client = client
        self._dim: int | None = _KNOWN_DIMS.get(model)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(
                    api_key=self._api_key or "not-needed",
                    base_url=self._base_url or None,
                    timeout=self._timeout,
                    max_retries=self._max_retries,
                )
            return self._client

    def _truncate(self, texts: Sequence[str]) -> list[str]:
        from ..llm.tokens import get_encoding

        enc = None
        out = []
        for text in texts:
            text = text if text.strip() else " "
            if len(text) > _MAX_INPUT_TOKENS:  # a token is at least one character
                enc = enc or get_encoding("cl100k_base")
                tokens = enc.encode_ordinary(text)
                if len(tokens) > _MAX_INPUT_TOKENS:
                    text = enc.decode(tokens[:_MAX_INPUT_TOKENS])
            out.append(text)
        return out

    def _request(self, batch: list[str]) -> list[list[float]]:
        import openai

        client = self._get_client()
        try:
            response = client.embeddings.create(model=self.model, input=batch)
        except openai.APITimeoutError as exc:
            raise LLMTimeoutError(
                f"the embeddings server did not answer within {self._timeout:g}s "
                f"(after {self._max_retries} retries): raise KB_AGENT_LLM_TIMEOUT or check the server"
            ) from exc
        except openai.APIConnectionError as exc:
            raise LLMError(
                f"cannot reach the embeddings server ({self._base_url or 'api.openai.com'}): "
                "check OPENAI_BASE_URL and the network"
            ) from exc
        except openai.AuthenticationError as exc:
            raise LLMError("the embeddings server refused the API key: check OPENAI_API_KEY", status=401) from exc
        except openai.APIStatusError as exc:
            raise LLMError(
                f"embedding with {self.model} failed with HTTP {exc.status_code}: "
                f"{_short(exc.message)} (check KB_AGENT_EMBEDDING_MODEL)",
                status=exc.status_code,
            ) from exc
        except openai.OpenAIError as exc:
            raise LLMError(f"embedding with {self.model} failed: {_short(str(exc))}") from exc
        data = sorted(response.data, key=lambda d: d.index)
        if len(data) != len(batch):
            raise LLMError(f"the embeddings server returned {len(data)} vectors for {len(batch)} texts")
        return [list(d.embedding) for d in data]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        inputs = self._truncate(texts)
        batches = [inputs[i : i + self.batch_size] for i in range(0, len(inputs), self.batch_size)]
        if len(batches) == 1 or self.max_parallel <= 1:
            results = [self._request(b) for b in batches]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(self.max_parallel, len(batches)), thread_name_prefix="crag-embed") as pool:
                results = list(pool.map(self._request, batches))
        vectors = np.asarray([v for r in results for v in r], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise LLMError("the embeddings server returned vectors of inconsistent sizes")
        if self._dim is not None and vectors.shape[1] != self._dim:
            raise LLMError(
                f"{self.model} returned {vectors.shape[1]}-dimensional vectors, expected {self._dim}"
            )
        self._dim = int(vectors.shape[1])
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def make_embedder(settings: Settings) -> HashEmbedder | OpenAIEmbedder:
    """The embedder ``KB_AGENT_EMBEDDER`` names."""
    if settings.embedder == "hash":
        return HashEmbedder()
    if settings.embedder == "openai":
        if not settings.openai_api_key and not settings.openai_base_url:
            raise ConfigError(
                "KB_AGENT_EMBEDDER",
                "openai",
                "hash, or openai with OPENAI_API_KEY or OPENAI_BASE_URL set",
            )
        return OpenAIEmbedder(
            settings.embedding_model,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
            timeout=settings.llm_timeout,
            max_retries=settings.llm_max_retries,
        )
    raise ConfigError("KB_AGENT_EMBEDDER", settings.embedder, "hash or openai")
