"""Token counting works with no network: tiktoken's cache is seeded from the shipped copies."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crag.llm import tokens
from crag.llm.tokens import count_tokens, encoding_for_model, get_encoding

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
SAMPLE = "Uploads retry three times with exponential backoff. 上传会重试三次。"


@pytest.fixture
def fresh_encodings():
    get_encoding.cache_clear()
    yield
    get_encoding.cache_clear()


def cached_file(cache_dir: Path) -> Path:
    return cache_dir / hashlib.sha1(O200K_URL.encode()).hexdigest()


def test_counts_tokens():
    assert count_tokens("hello world") == 2
    assert count_tokens("") == 0
    assert count_tokens("<|endoftext|>") > 1  # special-token text is ordinary text
    assert count_tokens(SAMPLE, "cl100k_base") > 0


@pytest.mark.parametrize("model,encoding", [
    ("gpt-4o-mini", "o200k_base"), ("gpt-4.1", "o200k_base"), ("gpt-4", "cl100k_base"),
    ("gpt-4-turbo", "cl100k_base"), ("gpt-3.5-turbo", "cl100k_base"), ("llama3.1:8b", "o200k_base"),
    ("text-embedding-3-small", "cl100k_base"),
])
def test_encoding_for_model(model, encoding):
    assert encoding_for_model(model) == encoding


def test_an_empty_cache_dir_is_seeded_from_the_shipped_copy(tmp_path, monkeypatch, fresh_encodings):
    expected = count_tokens(SAMPLE)
    get_encoding.cache_clear()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert count_tokens(SAMPLE) == expected
    data = cached_file(tmp_path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256


def test_a_corrupt_cached_file_is_replaced(tmp_path, monkeypatch, fresh_encodings):
    expected = count_tokens(SAMPLE)
    get_encoding.cache_clear()
    cached_file(tmp_path).write_bytes(b"corrupt")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert count_tokens(SAMPLE) == expected
    assert hashlib.sha256(cached_file(tmp_path).read_bytes()).hexdigest() == O200K_SHA256


def test_a_disabled_cache_loads_the_shipped_copy_directly(tmp_path, monkeypatch, fresh_encodings):
    expected = count_tokens(SAMPLE)
    get_encoding.cache_clear()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    encoding = get_encoding("o200k_base")
    assert len(encoding.encode(SAMPLE, disallowed_special=())) == expected
    assert encoding.decode(encoding.encode(SAMPLE)) == SAMPLE
    assert tokens._cache_dir() is None


def test_counting_in_a_fresh_process_needs_no_network(tmp_path):
    # Any download attempt would go through a proxy that does not exist, and fail.
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "cache"), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    code = "from crag.llm.tokens import count_tokens; print(count_tokens('hello world'), count_tokens('hi', 'cl100k_base'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1"]
    assert len(list((tmp_path / "cache").iterdir())) == 2


@pytest.mark.parametrize("blank", [" ", "\t", "\u3000"])
def test_a_million_blanks_in_a_row_are_counted_not_an_error(blank: str) -> None:
    """tiktoken's pre-tokenizer gives up on a run of more than about a million blanks followed
    by text ("Regex error while tokenizing: ... Max stack size exceeded for backtracking"):
    one such file (a padded export) made `crag index` end in that traceback."""
    from crag.index.token_count import token_counter

    text = "start" + blank * 1_100_000 + "end\nnext line\n"
    assert count_tokens(text) >= count_tokens("start end\nnext line\n")
    counter = token_counter()
    assert counter([text])[0] >= 3
    counts = counter.line_counts(["start" + blank * 1_100_000 + "end", "next line"])
    assert len(counts) == 2 and counts[0] >= 3 and counts[1] in (2, 3)
