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
API (imported lazily): batched (a batch the server refuses as too large, HTTP 413, is sent in
halves), a few requests in flight, retried under the same policy as
chat completions (``crag.llm.retry``: 429, 5xx, timeouts and dropped connections,
``KB_AGENT_LLM_MAX_RETRIES`` times, honouring ``Retry-After``), and its failures translated
into ``LLMError`` at this one boundary. Like a chat request, each attempt has a total
deadline of ``KB_AGENT_LLM_TIMEOUT`` (``crag.llm.deadline``), so a server that trickles its
reply a byte at a time cannot hold an indexer or a search. Its ``name`` is ``openai:<model>``.

``LocalEmbedder`` (``crag.index.local_embedder``, the optional ``crag-kb[local]`` extra) runs a
sentence-transformers model from the folder ``KB_AGENT_EMBEDDING_PATH`` names, offline.

``make_embedder(settings)`` picks one from ``KB_AGENT_EMBEDDER``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LLMError, LLMTimeoutError
from ..llm.bodies import base_url_hint, client_address, credentials_hint, http_client, redirect_note
from ..llm.deadline import request_deadline
from ..llm.lease import fork_safe
from ..llm.retry import (
    BadReplyFailure,
    ConnectionFailure,
    Failure,
    RetryPolicy,
    StatusFailure,
    TimeoutFailure,
    body_message,
    context_overflow,
    server_message,
)
from ..safe_text import scrub_error, valid_text
from ..text import STOPWORDS, stem
from ..text import content_words as tokenize
from .hash_embedder import BIGRAM_WEIGHT, DEFAULT_HASH_DIM, HASH_VERSION, HashEmbedder

if TYPE_CHECKING:
    import numpy as np

    from ..config import Settings
    from .local_embedder import LocalEmbedder

__all__ = [
    "BIGRAM_WEIGHT",
    "DEFAULT_HASH_DIM",
    "HASH_VERSION",
    "STOPWORDS",
    "HashEmbedder",
    "OpenAIEmbedder",
    "make_embedder",
    "stem",
    "tokenize",
]

# Dimensions of OpenAI's models, so that ``dim`` needs no request to OpenAI. Another server may
# serve these names with a model of its own (LocalAI's default text-embedding-ada-002 is a small
# local model): there the length is learnt from its vectors.
_KNOWN_DIMS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
_MAX_INPUT_TOKENS = 8000  # the embeddings API refuses inputs above 8191 tokens
# Statuses with which servers refuse a model they do not have or serve (OpenAI, Ollama, vLLM, TEI).
_MODEL_REFUSALS = frozenset({400, 403, 404, 422})
# How embedding servers say an input is longer than the model takes, beyond a chat server's words
# (``crag.llm.retry.context_overflow``): TEI ("`inputs` must have less than 512 tokens"), llama.cpp
# ("input is too large to process. increase the physical batch size").
_TOO_LONG = re.compile(r"must have less than \d+ tokens|input (?:is )?too (?:large|long)", re.I)


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
        policy: RetryPolicy | None = None,
        base_url_variable: str = "OPENAI_BASE_URL",
    ) -> None:
        self.model = model
        self._base_url_variable = base_url_variable  # where the user set base_url, for messages
        self.name = f"openai:{model}"
        self._api_key = api_key
        self._base_url = base_url
        self._timeout = timeout
        self._max_retries = max_retries
        self.policy = policy or RetryPolicy(max_retries)
        self.batch_size = batch_size
        self.max_parallel = max_parallel
        self._client = client
        self._dim: int | None = None if base_url else _KNOWN_DIMS.get(model)
        self._lock = threading.Lock()
        if client is None:  # the client crag makes is not shared with a forked child
            fork_safe(self)

    def _forked(self) -> None:
        """In a forked child: the next ``embed`` opens a client of its own (``crag.llm.lease``)."""
        self._lock = threading.Lock()
        self._client = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                import openai

                address, query, headers = client_address(self._base_url)
                self._client = openai.OpenAI(
                    api_key=self._api_key or "not-needed",
                    base_url=address,
                    default_query=query,
                    default_headers=headers,
                    timeout=self._timeout,
                    max_retries=0,  # retries are crag's own policy (crag.llm.retry)
                    http_client=http_client(openai, timeout=self._timeout),
                )
            return self._client

    def close(self) -> None:
        """Release the client's connections; the next ``embed`` opens a fresh client."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _truncate(self, texts: Sequence[str]) -> list[str]:
        from ..llm.tokens import get_encoding

        enc = None
        out = []
        for text in texts:
            text = valid_text(text) if text.strip() else " "
            if len(text) > _MAX_INPUT_TOKENS:  # a token is at least one character
                enc = enc or get_encoding("cl100k_base")
                tokens = enc.encode_ordinary(text)
                if len(tokens) > _MAX_INPUT_TOKENS:
                    text = enc.decode(tokens[:_MAX_INPUT_TOKENS])
            out.append(text)
        return out

    def _request(self, batch: list[str]) -> list[list[float]]:
        def attempt() -> Any:
            client = self._get_client()  # a retry after ``close`` gets the fresh client
            with request_deadline(self._timeout):  # the whole exchange, not only each read
                # Floats, not the SDK's default base64: the body crag checks is what is parsed.
                return client.embeddings.create(model=self.model, input=batch, encoding_format="float")

        response = self.policy.call(attempt, self._translate, server="embeddings")
        if isinstance(response, str):  # the SDK hands over a 2xx body that is not JSON as its text
            said = body_message(response)  # an HTML page's title, else its text, which may echo the key
            raise scrub_error(LLMError(
                "the embeddings server answered with something that is not JSON"
                + (f' ("{said}")' if said else "")
                + f" ({self.model}): check that {self._base_url_variable} is the address of its OpenAI-compatible API"
            ), (self._api_key,) if self._api_key else ())
        data = getattr(response, "data", None)
        if not isinstance(data, list) or not all(isinstance(getattr(d, "index", None), int) for d in data):
            # A gateway may answer 200 with an error object: its words say why there are no vectors.
            dump = getattr(response, "model_dump", None)
            said = body_message(dump(mode="json", exclude_unset=True, warnings=False)) if callable(dump) else ""
            raise scrub_error(LLMError(
                f"the embeddings server sent a reply without indexed vectors ({self.model})" + (f": {said}" if said else "")
            ), (self._api_key,) if self._api_key else ())
        data = sorted(data, key=lambda d: d.index)
        if len(data) != len(batch):
            raise LLMError(f"the embeddings server returned {len(data)} vectors for {len(batch)} texts")
        return _checked_vectors([d.embedding for d in data], self.model)

    def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        """``batch``'s vectors. A server that refuses a batch as too large (HTTP 413: TEI takes
        32 texts a request unless started with a larger ``--max-client-batch-size``) is sent it
        again in halves, down to one text, and the later batches are no larger than what it took."""
        try:
            return self._request(batch)
        except LLMError as exc:
            if exc.status != 413 or len(batch) == 1:
                raise
        half = (len(batch) + 1) // 2
        with self._lock:
            self.batch_size = min(self.batch_size, half)
        return self._embed_batch(batch[:half]) + self._embed_batch(batch[half:])

    def _translate(self, exc: BaseException, failure: Failure, retries: int) -> LLMError:
        """The one place an embeddings failure becomes a crag error, with the key (and any
        credential) a server echoed masked in it and in ``exc``, which is chained to it."""
        secrets = (self._api_key,) if self._api_key else ()
        scrub_error(exc, secrets)
        return scrub_error(self._error(exc, failure, retries), secrets)

    def _error(self, exc: BaseException, failure: Failure, retries: int) -> LLMError:
        after = f" (after {retries} {'retry' if retries == 1 else 'retries'})" if retries else ""
        if isinstance(failure, TimeoutFailure):
            return LLMTimeoutError(
                f"the embeddings server did not answer within {self._timeout:g}s{after}: "
                "raise KB_AGENT_LLM_TIMEOUT or check the server"
            )
        if isinstance(failure, ConnectionFailure):
            return LLMError(
                f"cannot reach the embeddings server ({self._base_url or 'api.openai.com'}){after}: "
                f"check {self._base_url_variable} and the network"
            )
        if isinstance(failure, StatusFailure):
            if failure.status == 401:
                what = credentials_hint(self._base_url, self._base_url_variable)
                return LLMError(f"the embeddings server refused the API key: check {what}", status=401)
            # The server's own words, however its body holds them (TEI: {"error": "..."}).
            detail = server_message(exc) or _short(getattr(exc, "message", exc))
            # A refused request may name a model the server does not have; a busy or failing
            # server (429, 5xx, after the retries) says nothing about the model, and a text
            # longer than the model's window is no sign of a wrong model either.
            hint = " (check KB_AGENT_EMBEDDING_MODEL)" if failure.status in _MODEL_REFUSALS else ""
            if failure.status == 404:  # no such model, or no API at that address
                url_hint = base_url_hint(self._base_url or "").strip(" ()")
                hint = f" (check KB_AGENT_EMBEDDING_MODEL and {self._base_url_variable}{'; ' if url_hint else ''}{url_hint})"
            if failure.too_long:  # not waited for, so not retried: say what the server asked
                asked = failure.retry_after
                wait = f"{asked:.0f} s" if asked is not None and math.isfinite(asked) else "longer than a number holds"
                hint = f" (it asked to retry after {wait}, longer than {self.policy.retry_after_cap:g} s: try again later)"
            elif context_overflow(exc, detail) is not None or _TOO_LONG.search(detail):
                hint = (" (a chunk or question is longer than the model takes: have the server truncate long inputs, "
                        "as TEI's --auto-truncate does, or use a model with a longer window)")
            return LLMError(
                f"embedding with {self.model} failed with HTTP {failure.status}{after}: {detail}{hint}"
                + redirect_note(exc, self._base_url_variable),
                status=failure.status,
            )
        if isinstance(failure, BadReplyFailure):
            note = f" ({failure.note})" if failure.note else ""
            return LLMError(f"the embeddings server {failure.what}{note} ({self.model})")
        return LLMError(f"embedding with {self.model} failed: {_short(str(exc))}")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        inputs = self._truncate(texts)
        batches = [inputs[i : i + self.batch_size] for i in range(0, len(inputs), self.batch_size)]
        if len(batches) == 1 or self.max_parallel <= 1:
            results = [self._embed_batch(b) for b in batches]
        else:
            import contextvars
            from concurrent.futures import ThreadPoolExecutor

            # Each batch's thread gets a copy of this one's context: the request deadline, a
            # cancellation and where retry waits are reported (crag.llm.retry) follow it.
            contexts = [contextvars.copy_context() for _ in batches]
            with ThreadPoolExecutor(min(self.max_parallel, len(batches)), thread_name_prefix="crag-embed") as pool:
                results = list(pool.map(lambda context, batch: context.run(self._embed_batch, batch), contexts, batches))
        lengths = sorted({len(v) for r in results for v in r})
        if len(lengths) > 1:  # each reply was of one length, but not all replies of the same
            raise LLMError(
                f"the embeddings server sent vectors of different lengths ({', '.join(map(str, lengths))}) "
                f"to one run's requests ({self.model}): check that one model answers for that name"
            )
        vectors = np.asarray([v for r in results for v in r], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise LLMError("the embeddings server returned vectors of inconsistent sizes")
        expected, self._dim = self._dim, int(vectors.shape[1])
        if expected is not None and self._dim != expected:
            # This call fails (its vectors cannot join those of the same run), but the length is
            # learnt: a long-lived process (crag mcp, an Agent) searches an index re-embedded since.
            raise LLMError(
                f"{self.model} returned {self._dim}-dimensional vectors, expected {expected}: the model "
                "behind that name has changed; run `python -m crag index` to re-embed the index with it"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors


def _checked_vectors(vectors: list[Any], model: str) -> list[list[float]]:
    """Vectors an embeddings server sent, if they are usable: lists of numbers, all of one
    length, finite and not all zero (such a vector scores 0 against everything); else LLMError."""
    import numpy as np

    if not all(isinstance(v, list) and v and all(type(x) in (int, float) for x in v) for v in vectors):
        raise LLMError(f"the embeddings server sent a vector that is not a list of numbers ({model})")
    if len({len(v) for v in vectors}) > 1:
        raise LLMError(f"the embeddings server sent vectors of different lengths in one reply ({model})")
    with np.errstate(over="ignore", invalid="ignore"):  # too large for float32: inf, refused below
        array = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(array).all():
        raise LLMError(f"the embeddings server sent vectors holding NaN or infinity ({model})")
    if not np.abs(array).max(axis=1).all():
        raise LLMError(f"the embeddings server sent an all-zero vector, which matches nothing ({model})")
    return vectors


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def make_embedder(settings: Settings) -> HashEmbedder | OpenAIEmbedder | LocalEmbedder:
    """The embedder ``KB_AGENT_EMBEDDER`` names."""
    if settings.embedder == "hash":
        return HashEmbedder()
    if settings.embedder == "local":
        from .local_embedder import LocalEmbedder

        return LocalEmbedder(settings.embedding_path)
    if settings.embedder == "openai":
        # KB_AGENT_EMBEDDING_BASE_URL: an embedding server apart from the chat server.
        base_url = settings.embedding_base_url or settings.openai_base_url
        if not settings.openai_api_key and not base_url:
            raise ConfigError(
                "KB_AGENT_EMBEDDER",
                "openai",
                "hash, local, or openai with OPENAI_API_KEY, OPENAI_BASE_URL or KB_AGENT_EMBEDDING_BASE_URL set",
            )
        return OpenAIEmbedder(
            settings.embedding_model,
            api_key=settings.openai_api_key,
            base_url=base_url,
            timeout=settings.llm_timeout,
            max_retries=settings.llm_max_retries,
            base_url_variable="KB_AGENT_EMBEDDING_BASE_URL" if settings.embedding_base_url else "OPENAI_BASE_URL",
        )
    raise ConfigError("KB_AGENT_EMBEDDER", settings.embedder, "hash, openai or local")
