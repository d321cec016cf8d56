"""A neural embedder that runs offline from a model folder on disk (the ``crag-kb[local]`` extra).

``LocalEmbedder(path)`` loads a sentence-transformers model (for example all-MiniLM-L6-v2)
from ``path`` with sentence-transformers on the CPU, never from a model hub: the hub is
switched off for the process before the library is imported, and the folder is opened with
``local_files_only``. Vectors are mean-pooled as the model's own configuration says and
normalised to unit length, so the store's inner product is their cosine.

The model is loaded on the first ``embed`` (or ``dim``), once per process: a long-running
process (``chat``, ``mcp``, the library) pays it once. Its ``name`` is
``local:<folder name>:<fingerprint>``, the fingerprint a CRC-32 of the folder's file names
and sizes and of its small configuration files, so an index built with another model (or
another version of it) is detected as a mismatch without loading anything.

What goes wrong is one ``ConfigError`` naming ``KB_AGENT_EMBEDDING_PATH`` or
``KB_AGENT_EMBEDDER``: a missing folder, a folder that holds no model, the extra not
installed, or a model that does not load.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["EXTRA_HINT", "LocalEmbedder"]

EXTRA_HINT = (
    "the local embedder's extra: pip install 'crag-kb[local]' "
    "(sentence-transformers; install PyTorch's CPU build first, see docs/retrieval.md)"
)
# A folder is a model when it holds one of these (a sentence-transformers folder, or a plain
# transformers one that sentence-transformers mean-pools).
_MODEL_FILES = ("modules.json", "config.json")
# Files small enough to read whole for the fingerprint (configuration, not weights).
_CONFIG_BYTES = 1 << 20


def _fingerprint(path: str) -> str:
    """CRC-32 of every file's relative name and size, and of the small JSON files' bytes."""
    crc = 0
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            if rel.startswith(".") or "/." in rel:
                continue
            try:
                size = os.path.getsize(full)
            except OSError:
                continue
            crc = zlib.crc32(f"{rel}\0{size}\0".encode("utf-8", "surrogatepass"), crc)
            if name.endswith(".json") and size <= _CONFIG_BYTES:
                try:
                    with open(full, "rb") as f:
                        crc = zlib.crc32(f.read(), crc)
                except OSError:
                    pass
    return f"{crc:08x}"


class LocalEmbedder:
    """A sentence-transformers model from a local folder, on the CPU (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], batch_size: int = 32) -> None:
        raw = os.fspath(path)
        if not raw.strip():
            raise ConfigError(
                "KB_AGENT_EMBEDDING_PATH", raw, "the folder of a sentence-transformers model (KB_AGENT_EMBEDDER=local)"
            )
        folder = os.path.abspath(os.path.expanduser(raw))
        if not os.path.isdir(folder):
            raise ConfigError("KB_AGENT_EMBEDDING_PATH", raw, "an existing folder holding a sentence-transformers model")
        if not any(os.path.isfile(os.path.join(folder, f)) for f in _MODEL_FILES):
            raise ConfigError(
                "KB_AGENT_EMBEDDING_PATH", raw, "a folder holding a sentence-transformers model (modules.json or config.json)"
            )
        if importlib.util.find_spec("sentence_transformers") is None:
            raise ConfigError("KB_AGENT_EMBEDDER", "local", EXTRA_HINT)
        self.path = folder
        self.batch_size = batch_size
        self.name = f"local:{os.path.basename(folder.rstrip(os.sep)) or 'model'}:{_fingerprint(folder)}"
        self._model: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                # Nothing may come from a model hub: switched off before the library loads.
                os.environ["HF_HUB_OFFLINE"] = "1"
                os.environ["TRANSFORMERS_OFFLINE"] = "1"
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no bars on crag's stderr
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ConfigError("KB_AGENT_EMBEDDER", "local", EXTRA_HINT) from exc
                try:
                    model = SentenceTransformer(self.path, device="cpu", local_files_only=True)
                except Exception as exc:  # the library's own errors: one line naming the folder
                    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
                    raise ConfigError(
                        "KB_AGENT_EMBEDDING_PATH", self.path, f"a sentence-transformers model that loads ({reason})"
                    ) from exc
                size = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
                self._dim = int(size() or model.encode(["probe"]).shape[1])
                self._model = model
            return self._model

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._load()
        assert self._dim is not None
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = model.encode(
            [t if t.strip() else " " for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)
