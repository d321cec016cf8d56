# crag: the two commands a fresh machine needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install demo test bench lint clean

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

bench: install
	$(PY) -m pip install -qq -e '.[bench]'
	$(PY) -m benchmarks.run_all

lint: install
	$(PY) -m pip install --quiet ruff
	$(VENV)/bin/ruff check crag tests benchmarks

clean:
	rm -rf $(VENV) .crag .crag-demo .pytest_cache .hypothesis
