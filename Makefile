# crag: the two commands a fresh machine needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test bench bench-full field answers lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $(STAMP)

install: $(STAMP)

demo: install
	@rm -rf .crag-demo
	KB_AGENT_LLM=offline KB_AGENT_INDEX_DIR=.crag-demo $(PY) -m crag index docs README.md
	KB_AGENT_LLM=offline KB_AGENT_INDEX_DIR=.crag-demo $(PY) -m crag ask "How do I point crag at a local Ollama server?"

test: install
	$(PY) -m pytest

# make bench: every benchmark, index_scale up to 100k chunks, retrieval on the 98 docs
# questions plus a 1,000-question prose sample, and store_scale on both stores at 100k
# chunks (about half an hour here on 2 cores, by the load beside it; the parts before
# store_scale are timed in docs/benchmarks.md), into benchmarks/results/.
# make bench-full: index_scale up to 1M chunks, all 8,416 prose questions and store_scale
# at a million chunks (hours here), into benchmarks/results/full/.
bench: install
	$(PY) -m pip install -qq -e '.[bench]'
	$(PY) -m benchmarks.run_all

bench-full: install
	$(PY) -m pip install -qq -e '.[bench]'
	$(PY) -m benchmarks.run_all --full

# A real OpenAI-compatible server (never part of make test), e.g.
#   make field FIELD_ARGS="--base-url http://127.0.0.1:8091/v1 --model qwen --questions 8 --context-tokens 2048"
FIELD_ARGS ?= --offline --questions 8
field: install
	$(PY) -m benchmarks.field $(FIELD_ARGS)

# Right answers end to end: crag's defaults, grading off, every question complex and the
# LangGraph CRAG tutorial on the SQuAD 2.0 held-out half and the docs set (never part of make test), e.g.
#   make answers ANSWERS_ARGS="--base-url http://127.0.0.1:8091/v1 --model qwen2.5-coder-1.5b"
ANSWERS_ARGS ?= --offline --quick
answers: install
	$(PY) -m benchmarks.answers $(ANSWERS_ARGS)

lint: install
	$(PY) -m ruff check crag tests benchmarks

clean:
	rm -rf $(VENV) .crag .crag-demo .pytest_cache .hypothesis .ruff_cache
