"""The OpenAI embedder against a loopback OpenAI-compatible server, and embedder selection."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from crag.config import Settings
from crag.errors import ConfigError, LLMError, LLMTimeoutError
from crag.index import index_roots, open_index
from crag.index.embedders import HashEmbedder, OpenAIEmbedder, make_embedder
from tests.openai_server import FakeOpenAIServer, Trickle

DIM = 8


def fake_vector(text: str) -> list[float]:
    """A deterministic, non-normalised vector: crag must normalise it."""
    v = [0.0] * DIM
    for word in text.lower().split():
        v[sum(map(ord, word)) % DIM] += 3.0
    return v if any(v) else [1.0] + [0.0] * (DIM - 1)


class EmbeddingsServer:
    """POST /v1/embeddings like OpenAI; ``fail`` holds statuses to answer before succeeding;
    a batch of more than ``max_batch`` texts is refused with 413, as TEI does."""

    def __init__(self) -> None:
        self.fail: list[int] = []
        self.max_batch: int | None = None
        self.batches: list[list[str]] = []
        self.auth: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.auth.append(self.headers.get("Authorization"))
                if outer.fail:
                    status = outer.fail.pop(0)
                    payload = {"error": {"message": f"status {status}", "type": "server_error"}}
                elif outer.max_batch is not None and len(body["input"]) > outer.max_batch:
                    status = 413
                    payload = {"error": f"batch size {len(body['input'])} > maximum allowed batch size "
                                        f"{outer.max_batch}", "error_type": "validation"}
                else:
                    status = 200
                    texts = body["input"]
                    outer.batches.append(list(texts))
                    data = [{"object": "embedding", "index": i, "embedding": fake_vector(t)} for i, t in enumerate(texts)]
                    data.reverse()  # the index field, not the order, says which is which
                    payload = {"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 1, "total_tokens": 1}}
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api():
    server = EmbeddingsServer()
    yield server
    server.close()


def embedder(api: EmbeddingsServer, **kw) -> OpenAIEmbedder:
    return OpenAIEmbedder("fake-embed", api_key="sk-test", base_url=api.url, timeout=5, **{"max_retries": 2, **kw})


def test_vectors_are_batched_ordered_and_unit_length(api: EmbeddingsServer) -> None:
    emb = embedder(api, batch_size=3, max_parallel=2)
    texts = [f"text number {i}" for i in range(7)]
    vecs = emb.embed(texts)
    assert vecs.shape == (7, DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0)
    expected = np.asarray([fake_vector(t) for t in texts], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(vecs, expected)
    assert sorted(len(b) for b in api.batches) == [1, 3, 3]
    assert set(api.auth) == {"Bearer sk-test"}
    assert emb.name == "openai:fake-embed" and emb.dim == DIM


def test_429_and_5xx_are_retried(api: EmbeddingsServer) -> None:
    api.fail = [429, 500]
    vecs = embedder(api).embed(["hello world"])
    assert vecs.shape == (1, DIM) and api.fail == []


def test_a_batch_the_server_refuses_as_too_large_is_sent_in_smaller_ones(api: EmbeddingsServer) -> None:
    # TEI takes 32 texts a request by default and answers a larger batch with 413: indexing
    # with crag's batches of 128 failed on the first one, whatever the knowledge base.
    api.max_batch = 3
    emb = embedder(api, batch_size=8, max_parallel=1)
    texts = [f"text number {i}" for i in range(20)]
    vecs = emb.embed(texts)
    expected = np.asarray([fake_vector(t) for t in texts], dtype=np.float32)
    assert np.allclose(vecs, expected / np.linalg.norm(expected, axis=1, keepdims=True))
    assert [t for b in api.batches for t in b] == texts and max(len(b) for b in api.batches) <= 3
    assert emb.batch_size == 2  # later batches are sent at a size the server took
    api.batches.clear()
    emb.embed(texts[:4])
    assert [len(b) for b in api.batches] == [2, 2]
    api.max_batch = 0  # refused even alone: the server's error, once
    with pytest.raises(LLMError, match=r"HTTP 413"):
        emb.embed(["x"])


def test_failures_become_crag_errors(api: EmbeddingsServer) -> None:
    api.fail = [401]
    with pytest.raises(LLMError, match="refused the API key: check OPENAI_API_KEY"):
        embedder(api, max_retries=0).embed(["x"])
    api.fail = [401]
    with_credentials = OpenAIEmbedder("fake-embed", api_key="sk-test", base_url=api.url.replace("//", "//u:pw@", 1),
                                      timeout=5, max_retries=0)
    with pytest.raises(LLMError, match=r"check the user and password in OPENAI_BASE_URL \(sent instead of OPENAI_API_KEY\)"):
        with_credentials.embed(["x"])
    api.fail = [404]
    with pytest.raises(LLMError, match=r"HTTP 404: .*status 404 \(check KB_AGENT_EMBEDDING_MODEL and OPENAI_BASE_URL\)$"):
        embedder(api, max_retries=0).embed(["x"])
    api.fail = [503, 503, 503]  # a failing server is no sign of a wrong model
    with pytest.raises(LLMError, match=r"HTTP 503 \(after 2 retries\): .*status 503$"):
        embedder(api, max_retries=2).embed(["x"])
    with pytest.raises(LLMError, match="cannot reach the embeddings server"):
        OpenAIEmbedder("m", api_key="k", base_url="http://127.0.0.1:9/v1", timeout=2, max_retries=0).embed(["x"])


@pytest.mark.parametrize(("reply", "said"), [
    # TEI puts its words in "error" itself; crag showed "HTTP 413: Error code: 413" alone.
    ({"error": "Input validation error: `inputs` must have less than 512 tokens. Given: 780",
      "error_type": "validation"}, r"HTTP 413: Input validation error: .* Given: 780 \(a chunk or question is longer than"),
    ({"error": "batch size 1 > maximum allowed batch size 0", "error_type": "validation"},
     r"HTTP 413: batch size 1 > maximum allowed batch size 0$"),
])
def test_an_embeddings_refusal_in_another_servers_words_is_shown(reply: dict, said: str) -> None:
    from tests.openai_server import Status

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Status(413, reply))
        emb = OpenAIEmbedder("bge-small", api_key="sk-test", base_url=srv.base_url, timeout=5, max_retries=0)
        with pytest.raises(LLMError, match=said):
            emb.embed(["one text"])


@pytest.mark.parametrize(("reply", "said"), [
    # A sign-in page or a server's banner at the configured address read as "a reply without
    # indexed vectors", as if an embeddings server had sent a broken list.
    (b"<!doctype html><html><head><title>Sign in - Corp SSO</title></head><body>...</body></html>",
     r'not JSON \("Sign in - Corp SSO"\) \(bge-small\): check that KB_AGENT_EMBEDDING_BASE_URL is the address'),
    (b"Ollama is running", r'not JSON \("Ollama is running"\)'),
    (b"<html><head><title>bad token sk-test-0123456789</title></head></html>", r'not JSON \("bad token \*\*\*"\)'),
])
def test_an_embeddings_address_answering_with_a_page_says_so(reply: bytes, said: str) -> None:
    from tests.openai_server import Garbage

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Garbage(reply, content_type="text/html"))
        emb = OpenAIEmbedder("bge-small", api_key="sk-test-0123456789", base_url=srv.base_url, timeout=5,
                             max_retries=0, base_url_variable="KB_AGENT_EMBEDDING_BASE_URL")
        with pytest.raises(LLMError, match=said) as info:
            emb.embed(["one text"])
    assert "0123456789" not in str(info.value)


def test_a_404_from_an_address_without_v1_names_the_address_too() -> None:
    # Ollama's address without /v1 answers "404 page not found": only the model was blamed.
    from tests.openai_server import Status

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Status(404, "404 page not found"))
        emb = OpenAIEmbedder("nomic-embed-text", base_url=srv.url, timeout=5, max_retries=0)
        with pytest.raises(LLMError, match=r"HTTP 404: 404 page not found \(check KB_AGENT_EMBEDDING_MODEL and "
                                           r"OPENAI_BASE_URL; OpenAI-compatible servers usually serve the API under /v1\)$"):
            emb.embed(["one text"])


def test_a_rate_limit_asking_for_a_long_wait_says_how_long() -> None:
    # A 429 with Retry-After: 3600 is not waited for; the error read "HTTP 429: slow down", with
    # nothing of the wait the server asked for, which the chat model's error does say.
    from tests.openai_server import Status

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Status(429, {"error": {"message": "slow down"}}, retry_after=3600))
        emb = OpenAIEmbedder("bge-small", base_url=srv.base_url, timeout=5, max_retries=3)
        with pytest.raises(LLMError, match=r"HTTP 429: slow down \(it asked to retry after 3600 s, longer than 60 s"):
            emb.embed(["one text"])
        assert len(srv.requests) == 1


def test_an_input_longer_than_the_embedding_model_takes_is_not_blamed_on_the_model_name() -> None:
    # vLLM's refusal (400) was told to "check KB_AGENT_EMBEDDING_MODEL": the model was right.
    from tests.openai_server import Status

    vllm = {"object": "error", "type": "BadRequestError", "code": 400, "message": (
        "This model's maximum context length is 512 tokens. However, you requested 610 tokens in the "
        "input for embedding generation. Please reduce the length of the input.")}
    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Status(400, vllm))
        emb = OpenAIEmbedder("bge-small", api_key="sk-test", base_url=srv.base_url, timeout=5, max_retries=0)
        with pytest.raises(LLMError, match=r"HTTP 400: This model's maximum context length is 512 tokens") as info:
            emb.embed(["one text"])
    assert "KB_AGENT_EMBEDDING_MODEL" not in str(info.value) and "have the server truncate" in str(info.value)


def test_an_unreachable_embedding_server_names_the_variable_that_set_its_address() -> None:
    from crag.config import Settings
    from crag.index.embedders import make_embedder

    down = "http://127.0.0.1:9/v1"
    for config, named in (
        (Settings(embedder="openai", openai_base_url=down, llm_max_retries=0), "OPENAI_BASE_URL"),
        (Settings(embedder="openai", embedding_base_url=down, openai_base_url="http://127.0.0.1:8/v1",
                  llm_max_retries=0), "KB_AGENT_EMBEDDING_BASE_URL"),
    ):
        with pytest.raises(LLMError, match=f"check {named} and the network"):
            make_embedder(config).embed(["x"])


def test_without_a_base_url_setting_embeddings_go_to_openai_whatever_the_sdk_would_read(monkeypatch) -> None:
    # An empty OPENAI_BASE_URL in the environment: the SDK, given no URL, read it and had none.
    monkeypatch.setenv("OPENAI_BASE_URL", "")
    embedder = make_embedder(Settings(embedder="openai", openai_api_key="sk-test"))
    assert str(embedder._get_client().base_url).rstrip("/") == "https://api.openai.com/v1"


def test_a_server_trickling_its_reply_cannot_hold_an_embedding_past_its_timeout() -> None:
    # Each byte comes well within the 1 s read timeout; the whole reply would take several seconds.
    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Trickle(0.02))
        emb = OpenAIEmbedder("fake-embed", api_key="sk-test", base_url=srv.base_url, timeout=1, max_retries=0)
        with pytest.raises(LLMTimeoutError, match=r"did not answer within 1s: raise KB_AGENT_LLM_TIMEOUT"):
            emb.embed(["hello world"])
        assert emb.embed(["hello world"]).shape == (1, srv.embedding_dim)  # the next request is served


def test_index_with_a_trickling_embeddings_server_is_one_line_and_status_1(tmp_path: Path, monkeypatch) -> None:
    import io

    from crag.cli import main
    from tests.fakes import clean_env

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nThe server listens on port 8080.\n", encoding="utf-8")
    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Trickle(0.02))
        monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "1")
        monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
        out, err = io.StringIO(), io.StringIO()
        assert main(["index", "docs"], out, err) == 1
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("crag: error: ") and "did not answer within 1s" in lines[0]


def test_an_index_built_with_the_openai_embedder_records_it(api: EmbeddingsServer, tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "a.md").write_text("# Alpha\n\nalpha beta gamma\n")
    (kb / "b.md").write_text("# Delta\n\ndelta epsilon\n")
    cfg = Settings(index_dir=str(tmp_path / "idx"), embedder="openai", embedding_model="fake-embed", openai_base_url=api.url, openai_api_key="sk-test")
    report = index_roots(cfg, [kb])
    assert report.embedder == "openai:fake-embed" and report.chunks_total == 2
    with open_index(cfg) as reader:
        assert reader.dim == DIM and reader.embedder_name == "openai:fake-embed"
        hits = reader.search("delta epsilon", 1)
        assert hits[0].path.endswith("b.md") and 0 <= hits[0].score <= 1


def test_make_embedder_follows_the_settings() -> None:
    assert isinstance(make_embedder(Settings()), HashEmbedder)
    emb = make_embedder(Settings(embedder="openai", openai_api_key="k", embedding_model="text-embedding-3-large"))
    assert emb.name == "openai:text-embedding-3-large" and emb.dim == 3072
    with pytest.raises(ConfigError, match="KB_AGENT_EMBEDDER=openai"):
        make_embedder(Settings(embedder="openai"))


# The hash embedder's definition, word by word (how it was first written): the bulk
# implementation must give exactly these vectors.
def reference_hash_embed(texts: list[str], dim: int = 1008, bigram_weight: float = 0.5) -> np.ndarray:
    import zlib

    from crag import text as w_
    from crag.index import hash_embedder as e

    out = np.zeros((len(texts), dim), dtype=np.float32)
    codes: list[int] = []
    lengths = []
    for text in texts:
        words = w_.WORD.findall(text.lower())
        codes += [-1 if w in w_.STOPWORDS else zlib.crc32(stem_v1(w).encode("utf-8")) for w in words]
        lengths.append(len(words))
    codes_arr = np.asarray(codes, dtype=np.int64)
    rows = np.repeat(np.arange(len(texts), dtype=np.uint64), lengths)
    keep = codes_arr >= 0
    uni, rows = codes_arr[keep].astype(np.uint64), rows[keep]
    if not uni.size:
        return out
    low = np.uint64((1 << e._KEY_BITS) - 1)
    feats, feat_rows = [e._mix(uni) & low & ~np.uint64(e._BIGRAM_FLAG)], [rows]
    if bigram_weight and uni.size > 1:
        same = rows[1:] == rows[:-1]
        feats.append((e._mix(((uni[:-1] << np.uint64(32)) | uni[1:])[same]) & low) | np.uint64(e._BIGRAM_FLAG))
        feat_rows.append(rows[1:][same])
    keys, counts = np.unique((np.concatenate(feat_rows) << np.uint64(e._KEY_BITS)) | np.concatenate(feats), return_counts=True)
    weights = 1.0 + np.log(counts.astype(np.float32))
    weights[(keys & np.uint64(e._BIGRAM_FLAG)) != 0] *= np.float32(bigram_weight)
    weights[(keys & np.uint64(e._SIGN_BIT)) != 0] *= np.float32(-1.0)
    slots = ((keys & np.uint64(0xFFFFFFFF)) % np.uint64(dim)).astype(np.int64)
    if dim & (dim - 1) == 0:  # a power of two: the low bits, as the first definition took them
        assert np.array_equal(slots, (keys & np.uint64(dim - 1)).astype(np.int64))
    np.add.at(out.reshape(-1), (keys >> np.uint64(e._KEY_BITS)).astype(np.int64) * dim + slots, weights.astype(np.float32))
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def stem_v1(word: str) -> str:
    """The stems version 1 of the hash embedder hashes, frozen: "retried" is "retri" there,
    though ``crag.text.stem`` now makes it "retry" as it does "retries"; an index built
    before must keep matching its queries."""
    from crag.text import stem

    return word[:-2] if word.endswith("ied") and len(word) > 4 else stem(word)


TRICKY = [
    "",
    "   ",
    "The tokens of a Tokenizer: tokenizing, tokenized, tokenizes!",
    "snake_case_words and kebab-case-words, CamelCaseWords 2024 v1.2.3",
    "Café naïve résumé — “quoted” ‘text’ … 🤗 emoji─box│drawing",
    "İstanbul KELVIN ßtraße ﬁne ǅemal ΣΟΦΟΣ Ὀδυσσεύς 日本語のテキスト 한국어",
    "a" * 17 + " " + "b" * 16 + " " + "c" * 40 + " supercalifragilisticexpialidocious",
    "the and of to is was were been being",
    "Uploads are retried, copied and applied; retries, copies, died",
    "x\x00y\tz\x0bw\x1cv\x85u\u2028t\u00a0s",
    "cafe\u0301 e\u0301cole",
]


def test_hash_embedder_matches_the_word_by_word_definition() -> None:
    emb = HashEmbedder()
    texts = TRICKY + [t.upper() for t in TRICKY] + [" ".join(TRICKY)]
    assert np.array_equal(emb.embed(texts), reference_hash_embed(texts))
    # again, with every word now known (the vocabulary path), and one text at a time
    assert np.array_equal(emb.embed(texts), reference_hash_embed(texts))
    for t in TRICKY:
        assert np.array_equal(emb.embed([t]), reference_hash_embed([t]))
    small = HashEmbedder(64, bigram_weight=0.25)
    assert np.array_equal(small.embed(texts), reference_hash_embed(texts, 64, 0.25))
    assert np.array_equal(HashEmbedder(1024).embed(texts), reference_hash_embed(texts, 1024))


def test_hash_embedder_matches_the_definition_on_a_real_corpus() -> None:
    from crag.index.discover import discover, read_file_text

    root = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "fastapi_docs"
    if not root.is_dir():
        pytest.skip(f"{root} is not available")
    texts = [read_file_text(f.path)[1] for f in discover([root]).files[:120]]
    emb = HashEmbedder()
    for i in range(0, len(texts), 40):
        assert np.array_equal(emb.embed(texts[i : i + 40]), reference_hash_embed(texts[i : i + 40]))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=6))
def test_hash_embedder_matches_the_definition_on_any_text(texts: list[str]) -> None:
    assert np.array_equal(HashEmbedder(256).embed(texts), reference_hash_embed(texts, 256))


def _body(data: list, extra: bytes = b"") -> bytes:
    return json.dumps({"object": "list", "model": "m", "data": [
        {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(data)]}).encode() + extra


@pytest.mark.parametrize(("reply", "said"), [
    (_body([[0.1, 0.2, 0.3], [0.1, 0.2]]), "vectors of different lengths"),
    (_body([[0.1, 0.2], [0.3, 0.4]]).replace(b'"list"', b'"l\xffst"'), r"not UTF-8 text \(byte \d+ is 0xff\)"),
    (b"[" * 2000 + b"]" * 2000, "nested more than 64 levels deep"),
    (_body([[0.1, 0.2], [0.3, 0.4]]).replace(b"0.3", b"NaN"), "NaN or infinity"),
    (_body([[0.1, 0.2], [0.3, 0.4]]).replace(b"0.3", b"1e300"), "NaN or infinity"),  # inf as float32
    (_body([[0.1, 0.2], [0.0, 0.0]]), "an all-zero vector"),
    (_body([[0.1, 0.2], ["x", 0.4]]), "not a list of numbers"),
    (b'{"object": "list", "data": null}', "without indexed vectors"),
    # A gateway's 200 with an error object: its words were dropped.
    (b'{"error": {"message": "model bge-small is not loaded", "type": "server_error"}}',
     r"without indexed vectors \(fake-embed\): model bge-small is not loaded$"),
])
def test_an_embeddings_reply_crag_cannot_use_is_one_llm_error(reply: bytes, said: str) -> None:
    # Vectors of different lengths, bad bytes and deep nesting were tracebacks; NaN and all-zero
    # vectors were stored, and every later hit scored 0.000.
    from tests.openai_server import Garbage

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", Garbage(reply))
        emb = OpenAIEmbedder("fake-embed", api_key="sk-test", base_url=srv.base_url, timeout=5, max_retries=0)
        with pytest.raises(LLMError, match=said):
            emb.embed(["one text", "another text"])
        assert srv.requests[0].body["encoding_format"] == "float"


def test_batches_answered_with_vectors_of_different_lengths_are_one_llm_error() -> None:
    # Each reply of one length, but not the two replies of one call (two models behind one name,
    # a model swapped mid-run): a numpy ValueError traceback out of `crag index`.
    from tests.openai_server import Raw

    def reply(dim: int) -> Raw:
        return Raw({"object": "list", "model": "m", "data": [{"object": "embedding", "index": 0,
                                                             "embedding": [0.5] * dim}]})

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", reply(4), reply(8))
        emb = OpenAIEmbedder("fake-embed", base_url=srv.base_url, timeout=5, max_retries=0, batch_size=1,
                             max_parallel=1)
        with pytest.raises(LLMError, match=r"vectors of different lengths \(4, 8\) to one run's requests"):
            emb.embed(["one text", "another text"])


def test_an_embedder_whose_model_changed_length_fails_once_then_follows_the_new_length() -> None:
    """A long-lived process (crag mcp, an Agent) learnt the length from its first search; once
    the model behind the name changed, every search failed with "expected 64", even after
    `crag index` had re-embedded the index as told, until the process was restarted."""
    from tests.openai_server import Raw

    def reply(dim: int) -> Raw:
        return Raw({"object": "list", "model": "m", "data": [{"object": "embedding", "index": 0,
                                                             "embedding": [0.5] * dim}]})

    with FakeOpenAIServer() as srv:
        srv.script("embeddings", reply(4), reply(8), reply(8))
        emb = OpenAIEmbedder("fake-embed", base_url=srv.base_url, timeout=5, max_retries=0)
        assert emb.embed(["query"]).shape == (1, 4)
        with pytest.raises(LLMError, match=r"returned 8-dimensional vectors, expected 4: .* `python -m crag index`"):
            emb.embed(["query"])
        assert emb.embed(["query"]).shape == (1, 8) and emb.dim == 8


def _one_file_with_an_openai_embedder(tmp_path: Path, monkeypatch, model: str) -> None:
    """A knowledge base ``docs`` of one file in ``tmp_path`` (the working folder), to be indexed
    with the openai embedder's ``model`` and answered offline."""
    from tests.fakes import clean_env

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nAlpha retention is 5 days.\n", encoding="utf-8")
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("KB_AGENT_EMBEDDING_MODEL", model)


def test_an_embedding_model_whose_vectors_changed_length_is_re_embedded_not_a_traceback(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    """The same model name served with another dimension (another model pulled under that tag,
    another server): adding a file was a numpy ValueError traceback from concatenating 64- and
    32-dimensional vectors. It is an embedder change: `index` re-embeds and says so, `--kb`
    (which never re-embeds) is one line telling to re-index."""
    from tests.fakes import cli

    _one_file_with_an_openai_embedder(tmp_path, monkeypatch, "custom-embed")
    with FakeOpenAIServer(embedding_dim=64) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        assert cli("index", "docs")[0] == 0
    (tmp_path / "docs" / "b.md").write_text("# B\n\nBeta retention is 6 days.\n", encoding="utf-8")
    with FakeOpenAIServer(embedding_dim=32) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        code, out, err = cli("search", "beta retention", "--kb", "docs")
        assert code == 1 and not out and err.count("\n") == 1 and "crag index" in err and "32" in err, err
        code, out, err = cli("index", "docs")
        assert code == 0 and "re-embedded everything" in out and "2 in the index" in out, out + err
        code, out, err = cli("search", "beta retention", "--json")
        assert code == 0 and json.loads(out)[0]["path"] == "docs/b.md", err


def test_an_openai_model_name_served_elsewhere_with_other_vectors_indexes_and_searches(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """LocalAI serves `text-embedding-ada-002` with a small local model by default: crag took the
    name's OpenAI length (1536) for granted, and every `crag index` failed with "returned
    64-dimensional vectors, expected 1536", which no setting could mend."""
    from tests.fakes import cli

    _one_file_with_an_openai_embedder(tmp_path, monkeypatch, "text-embedding-ada-002")
    with FakeOpenAIServer(embedding_dim=64) as srv:
        monkeypatch.setenv("KB_AGENT_EMBEDDING_BASE_URL", srv.base_url)
        code, out, err = cli("index", "docs")
        assert code == 0 and "1 in the index" in out, out + err
        code, out, err = cli("search", "alpha retention", "--json")
        assert code == 0 and json.loads(out)[0]["path"] == "docs/a.md", err
    assert OpenAIEmbedder("text-embedding-ada-002").dim == 1536  # OpenAI itself: no request to learn it


def test_an_index_whose_files_are_unchanged_is_re_embedded_when_its_vectors_changed_length(
    tmp_path: Path, monkeypatch
) -> None:
    """With no file changed, `crag index` answered "the index was already up to date" to the
    search error that told the user to run it: the length was compared only when something
    was to be written, so the advice could never work. While the embeddings server cannot be
    reached, an unchanged index is still reported unchanged."""
    from tests.fakes import clean_env, cli

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nAlpha retention is 5 days.\n", encoding="utf-8")
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("KB_AGENT_EMBEDDING_MODEL", "custom-embed")
    with FakeOpenAIServer(embedding_dim=64) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        assert cli("index", "docs")[0] == 0
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    code, out, err = cli("index", "docs")  # the server is gone: nothing to write, nothing to ask it
    assert code == 0 and "already up to date" in out, out + err
    with FakeOpenAIServer(embedding_dim=32) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        code, out, err = cli("search", "alpha retention")
        assert code == 1 and "32-dimensional" in err and "`python -m crag index docs` to re-index" in err, err
        code, out, err = cli("index", "docs")
        assert code == 0 and out.startswith("re-embedded everything: the index was built with"), out + err
        assert "(now 32 dimensions)" in out
        code, out, err = cli("search", "alpha retention", "--json")
        assert code == 0 and json.loads(out)[0]["path"] == "docs/a.md", err


def test_an_embeddings_request_redirected_as_a_get_says_where_it_went() -> None:
    """A 301 from the embeddings address: the HTTP library resends the POST as a GET, which the
    server refuses, and the error named that refusal alone."""

    class Moved(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(301)
            self.send_header("Location", "/v2/embeddings")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises(LLMError, match=r"HTTP 405.*redirected the request \(301\) to " + re.escape(url)
                           + r"/v2/embeddings: set KB_AGENT_EMBEDDING_BASE_URL"):
            OpenAIEmbedder("m", api_key="k", base_url=url + "/v1", timeout=5, max_retries=0,
                           base_url_variable="KB_AGENT_EMBEDDING_BASE_URL").embed(["x"])
    finally:
        httpd.shutdown()
        httpd.server_close()
