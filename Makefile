# The one entry point: CI calls these same targets (.ci/run -> make test).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every process that tokenises: the Rust tokenizer's own thread pool is not
# fork-safe and fights the model for the cores.
export TOKENIZERS_PARALLELISM := false
SYSTEM_PACKAGES := nginx redis-server shellcheck

.PHONY: serve test lint typecheck check install install-dev system-deps bench clean

## make serve: install into .venv and serve $SERVING_HANDLER (default: the MiniLM handler).
serve: $(BIN)/.runtime
	$(BIN)/serving-core serve

## make test: install everything, then lint, type-check and run the whole suite.
test: $(BIN)/.dev system-deps lint typecheck
	$(BIN)/pytest

lint: $(BIN)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.dev
	$(BIN)/mypy

install: $(BIN)/.runtime
install-dev: $(BIN)/.dev

$(BIN)/.runtime: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -e .
	touch $@

$(BIN)/.dev: $(BIN)/.runtime requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

# The suite starts real nginx and redis-server on 127.0.0.1; install them from
# Debian when missing (CI runs as root; elsewhere this asks for sudo).
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  sudo_=""; [ "$$(id -u)" = 0 ] || sudo_=sudo; \
	  $$sudo_ apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo_ apt-get install -y -qq --no-install-recommends $$missing; \
	fi

bench: $(BIN)/.dev
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
