# The one entry point: CI calls these same targets. Two suites, each named for whom
# it serves: `make check` is a template user's (their handlers, their image, the chart
# with their values: ci.yml runs it on every push), `make test` the framework's
# (.ci/run; ci.yml runs it when the framework's files change, and nightly).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Every process that tokenises: the Rust tokenizer's own thread pool is not
# fork-safe and fights the model for the cores.
export TOKENIZERS_PARALLELISM := false
# prometheus: its promtool runs the alerts' rule tests (tests/deploy/test_alerts.py);
# prometheus-nginx-exporter: the chart's nginx sidecar, run by test_alerts_prometheus.py.
SYSTEM_PACKAGES := nginx redis-server rabbitmq-server shellcheck gettext-base chromium prometheus prometheus-nginx-exporter
# The container tests (tests/container) build and run the images with docker
# when its daemon answers, else with podman as root: podman, its OCI runtime and
# networking, and debootstrap for the stand-in base images built where no
# registry can be reached (tests/container/bases.py).
CONTAINER_PACKAGES := podman runc netavark aardvark-dns iptables debootstrap

# Every install goes through constraints.txt, so a handler's unpinned torch gets
# the tested version. A handler's requirements also see the torch index, as an
# extra index (PyPI stays the main one): torch==2.13.0 then resolves to its +cpu
# build instead of PyPI's CUDA build. The framework's own requirements need no
# torch and never ask that index (where it cannot be reached, pip retries it
# for every package). `make serve TORCH_VARIANT=cu128` on a GPU machine;
# TORCH_INDEX_URL= (empty) for PyPI alone, which the container tests' image
# builds receive too (exported).
#
# Where that index cannot be reached (a network that drops its packets), pip
# would retry it for every requirement, for hours: so, like .ci/run, the index is
# probed once per make run (8 s at most) and left out when it does not answer.
# An explicit TORCH_INDEX_URL (empty included) wins and probes nothing.
TORCH_VARIANT ?= cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/$(TORCH_VARIANT)/
TORCH_INDEX_URL ?= $(torch_index_probed)
# Recursive, then replaced by its value on first use: one probe per make run.
torch_index_probed = $(eval torch_index_probed := $(call probe_torch_index))$(torch_index_probed)
# A thread, so that a name lookup that hangs (urlopen's timeout does not cover it)
# is bounded too; no coreutils `timeout`, which macOS lacks.
probe_torch_index = $(if $(shell $(PYTHON) -c 'import os, threading, urllib.request as u; \
	threading.Thread(target=lambda: (u.urlopen("$(TORCH_INDEX)", timeout=5), os._exit(0)), daemon=True).start(); \
	threading.Event().wait(8); os._exit(1)' >/dev/null 2>&1 && echo up),$(TORCH_INDEX),$(info make: \
	$(TORCH_INDEX) does not answer; installing with TORCH_INDEX_URL= (PyPI and pip's own configuration)))
export TORCH_INDEX_URL
PIP_INSTALL := $(PIP) install -q --constraint constraints.txt
PIP_INSTALL_HANDLER := $(PIP_INSTALL) $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL))

# Install stamps live in the venv (a new venv installs again) and mirror the
# requirements file they stand for: .venv/.installed/handlers/x/requirements.txt
# is remade only when handlers/x/requirements.txt or constraints.txt changes.
STAMPS := $(VENV)/.installed
stamps = $(addprefix $(STAMPS)/,$(wildcard $(addsuffix /requirements.txt,$(1))))

# The handler `make serve` serves: SERVING_HANDLER (from the environment or the
# command line) is a handler.py, its folder, or a module path, each with an
# optional :Class. Its folder's requirements.txt is installed: the file's
# folder, the folder itself, the folder of the module's file when it is one
# here (handlers.x.handler is handlers/x/handler.py), else the default handler's.
# The default is the handler the images serve, named once in image.yml's
# HANDLER_DIR (README, "Your model", step 5); handlers/minilm without image.yml.
DEFAULT_HANDLER_DIR := $(or $(shell sed -n 's/^  HANDLER_DIR: *\([^ #]*\).*/\1/p' \
	.github/workflows/image.yml 2>/dev/null),handlers/minilm)
SERVING_HANDLER ?= $(DEFAULT_HANDLER_DIR)
without_class = $(firstword $(subst :, ,$(1)))
module_file = $(subst .,/,$(1)).py
handler_dir = $(patsubst %/,%,$(or \
	$(if $(wildcard $(1)/.),$(1)), \
	$(if $(filter %.py,$(1)),$(dir $(1))), \
	$(if $(wildcard $(call module_file,$(1))),$(dir $(call module_file,$(1)))), \
	$(DEFAULT_HANDLER_DIR)))
SERVE_DIR := $(call handler_dir,$(call without_class,$(SERVING_HANDLER)))

# `make contracts` runs the contract check on every handler folder with a sample.json.
HANDLERS ?= $(patsubst %/sample.json,%,$(wildcard handlers/*/sample.json))
ALL_HANDLER_DIRS := $(patsubst %/,%,$(dir $(wildcard handlers/*/requirements.txt)))

# `make image`: the handler the image serves, the folders it imports from beside
# it (SHARED_DIRS=handlers/iris for an iris classifier), and its tag.
HANDLER_DIR ?= $(DEFAULT_HANDLER_DIR)
SHARED_DIRS ?=
IMAGE ?= serving-core:$(notdir $(patsubst %/,%,$(HANDLER_DIR)))$(if $(filter-out cpu,$(TORCH_VARIANT)),-$(TORCH_VARIANT))
# docker when its daemon answers, else podman (as tests/container chooses).
CONTAINER_ENGINE ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)
# The framework's version (CHANGELOG.md, the tags vX.Y.Z, `serving-core --version`),
# in a local image's io.github.serving-core.version label as in CI's (the build
# argument VERSION is the image's own, org.opencontainers.image.version).
FRAMEWORK_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

# The chart values `make check` renders: the file deploy.yml deploys (the repository
# variable DEPLOY_VALUES_FILE, else its default). Yours: a file of your own, say
# helm/values.yaml, with `make check CHART_VALUES=helm/values.yaml` and that variable.
CHART_VALUES ?= $(or $(DEPLOY_VALUES_FILE),helm/serving-core/examples/values-default.yaml)
# What a template user's handlers must pass: ruff (pyproject's rules, lines of at most
# 100) and mypy over each folder of handlers/, a training script beside its handler
# included. mypy's defaults, not the framework's --strict (the examples are held to
# that by make typecheck), and a library without stubs is not the handler's bug.
HANDLER_DIRS := $(patsubst %/,%,$(wildcard handlers/*/))
# The served handler's image through the nginx image (tests/container), and the
# chart rendered with CHART_VALUES.
USER_TESTS := tests/container/test_stack.py::test_the_image_serves_the_handler_image_yml_names \
	tests/container/test_stack.py::test_the_handlers_sample_answers_through_nginx_as_serving_core_check_does \
	tests/deploy/test_chart_user_values.py

.PHONY: serve dev check lint-handlers typecheck-handlers contracts upgrade test test-fast test-template \
	fuzz schemathesis lint typecheck docs image install install-dev install-handlers \
	system-deps bench clean docs-settings chart-docs chart-docs-tools textgen-model

## make serve: install the framework and $SERVING_HANDLER's requirements, then serve it.
serve: $(BIN)/.runtime $(call stamps,$(SERVE_DIR))
	SERVING_HANDLER='$(SERVING_HANDLER)' $(BIN)/serving-core serve

## make dev: make serve, restarting the workers when a file of the handler changes.
dev: $(BIN)/.runtime $(call stamps,$(SERVE_DIR))
	SERVING_HANDLER='$(SERVING_HANDLER)' $(BIN)/serving-core serve --reload

## make check: the template user's suite (ci.yml runs it on every push): ruff and mypy on
## handlers/, every handler's contract and sample, the served handler's image answering its
## sample through the nginx image (docker, else podman), the chart with $CHART_VALUES.
check: lint-handlers typecheck-handlers contracts
	@test -f '$(CHART_VALUES)' || { echo "make check: CHART_VALUES=$(CHART_VALUES) is not a file" >&2; exit 1; }
	CHART_VALUES='$(CHART_VALUES)' $(BIN)/pytest -p no:cacheprovider $(USER_TESTS)

lint-handlers: $(BIN)/.dev
	$(BIN)/ruff check handlers
	$(BIN)/ruff format --check handlers

typecheck-handlers: $(BIN)/.dev $(call stamps,$(HANDLERS))
	@for dir in $(HANDLER_DIRS); do \
	  ls "$$dir"/*.py >/dev/null 2>&1 || continue; \
	  echo "mypy $$dir"; \
	  (cd "$$dir" && MYPYPATH=$(CURDIR) $(abspath $(BIN))/mypy --config-file '' --python-version 3.11 \
	    --cache-dir $(CURDIR)/.mypy_cache --ignore-missing-imports $$(ls *.py)) || exit 1; \
	done

## make upgrade [TO=vX.Y.Z] [UPSTREAM=URL]: bring in the framework's changes from the version
## this repository is at (pyproject.toml) to TO (the newest tag); your handlers/ never change.
upgrade:
	tools/upgrade

## make test: install everything, then lint, type-check, build the docs, check every handler,
## run the suite (tests/container builds both images and runs them, with docker or podman).
test: install-dev install-handlers system-deps chart-docs-tools lint typecheck docs contracts
	$(BIN)/pytest

## make test-fast: the suite for the edit-test loop, without what starts real servers (e2e:
## gunicorn, nginx, the brokers), the real model, the images and the template's clone.
test-fast: install-dev install-handlers system-deps chart-docs-tools
	$(BIN)/pytest -m 'not e2e and not model and not container and not template'

## make test-template: the template made a new owner's on a fresh clone (init a handler, point
## image.yml at it, delete the examples) passes make check there, and again after make upgrade
## (tests/deploy/test_template.py; .ci/run runs it).
test-template: install-dev system-deps
	$(BIN)/pytest -m template tests/deploy/test_template.py

## make fuzz: tests/web/test_fuzz.py with 1,000 generated cases per test (make test runs 15).
fuzz: install-dev
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-1000} $(BIN)/pytest -p no:cacheprovider tests/web/test_fuzz.py

## make schemathesis: tests/openapi/test_schemathesis.py with 500 cases per operation (make test runs 10).
schemathesis: install-dev
	SCHEMATHESIS_EXAMPLES=$${SCHEMATHESIS_EXAMPLES:-500} $(BIN)/pytest -p no:cacheprovider \
	  tests/openapi/test_schemathesis.py

lint: $(BIN)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo

## make docs-settings: regenerate docs/settings.md's table from Settings (a test keeps them equal).
docs-settings: $(BIN)/.runtime
	$(BIN)/python -m serving_core.settings.doc docs/settings.md

# The chart README's Parameters tables come from values.yaml's `## @param`
# comments through Bitnami's readme-generator-for-helm, at the version (and with
# the dependencies) tools/chart-docs/package-lock.json pins: `npm ci` installs
# exactly those. tests/deploy/test_chart_docs.py runs it on a copy and fails when
# the README is not what it generates.
CHART_DOCS_TOOLS := tools/chart-docs
CHART_DOCS_STAMP := $(CHART_DOCS_TOOLS)/node_modules/.installed
CHART_DIR := helm/serving-core

## make chart-docs: regenerate helm/serving-core/README.md's Parameters tables from values.yaml.
chart-docs: $(CHART_DOCS_STAMP)
	$(CHART_DOCS_TOOLS)/node_modules/.bin/readme-generator \
	  --values $(CHART_DIR)/values.yaml --readme $(CHART_DIR)/README.md

## make chart-docs-tools: install the generator (node and npm needed; make test runs it).
chart-docs-tools: $(CHART_DOCS_STAMP)

$(CHART_DOCS_STAMP): $(CHART_DOCS_TOOLS)/package.json $(CHART_DOCS_TOOLS)/package-lock.json
	@command -v npm >/dev/null || { echo "make chart-docs needs node and npm (apt-get install nodejs npm)" >&2; exit 1; }
	npm ci --prefix $(CHART_DOCS_TOOLS) --no-audit --no-fund --loglevel=error
	touch $@

# mypy strict on serving_core (pyproject), and on the example handlers users
# copy while they are there (a template's owner may delete them).
TYPED_EXAMPLES := $(wildcard handlers/echo handlers/minilm)
typecheck: $(BIN)/.dev
	$(BIN)/mypy serving_core $(TYPED_EXAMPLES)
	$(if $(wildcard handlers/textgen),cd handlers/textgen && MYPYPATH=$(CURDIR) \
	  $(abspath $(BIN))/mypy handler.py kvrows.py train.py)

## make docs: docs/ built into site/ with mkdocs --strict: a page missing from the nav, a broken
## link or anchor (the README's too, docs/repo_links.py) fails it.
# Material for MkDocs prints a banner about MkDocs 2 on every build; mkdocs-material
# is maintained until 2027-05 (docs/development.md).
docs: $(BIN)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

## make contracts: `serving-core check` (load, run sample.json) on each of $(HANDLERS).
contracts: $(BIN)/.runtime $(call stamps,$(HANDLERS))
	@test -n "$(strip $(HANDLERS))" || { echo "make contracts: no handlers/*/sample.json found"; exit 1; }
	@for dir in $(HANDLERS); do \
	  echo "serving-core check $$dir"; \
	  $(BIN)/serving-core check "$$dir" > /dev/null \
	    || { echo "make contracts: the handler in $$dir failed its check (the error is above)" >&2; exit 1; }; \
	done

## make image HANDLER_DIR=handlers/x [TORCH_VARIANT=cu128]: build the app image of one handler
## (docker when its daemon answers, else podman).
image:
	$(CONTAINER_ENGINE) build --build-arg HANDLER_DIR=$(HANDLER_DIR) --build-arg TORCH_VARIANT=$(TORCH_VARIANT) \
	  --build-arg SHARED_DIRS='$(SHARED_DIRS)' --build-arg FRAMEWORK_VERSION=$(FRAMEWORK_VERSION) --tag $(IMAGE) .

## make install: the framework and the served handler's requirements.
install: $(BIN)/.runtime $(call stamps,$(SERVE_DIR))
## make install-dev: the framework and the test tools (enough for tests/container).
install-dev: $(BIN)/.dev
## make install-handlers: every handler's requirements (the suite loads MiniLM and the examples).
install-handlers: $(BIN)/.runtime $(call stamps,$(ALL_HANDLER_DIRS))

# setup.py compiles the V2 gRPC stubs from the proto: a change to either installs again.
$(BIN)/.runtime: requirements.txt constraints.txt pyproject.toml setup.py serving_core/grpc/proto/grpc_predict_v2.proto
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP_INSTALL) -r requirements.txt -e .
	touch $@

$(BIN)/.dev: $(BIN)/.runtime requirements-dev.txt
	$(PIP_INSTALL) -r requirements-dev.txt
	touch $@

# One handler's requirements, under the constraints (after the framework, so
# the framework's pins are in place first).
$(STAMPS)/%/requirements.txt: %/requirements.txt constraints.txt | $(BIN)/.runtime
	$(PIP_INSTALL_HANDLER) -r $<
	@mkdir -p $(@D) && touch $@

# The suite starts real nginx, redis-server and rabbitmq-server on 127.0.0.1
# (each on its own ports and data, never the Debian service), and builds and runs
# the images; install what is missing from Debian (CI runs as root; elsewhere
# this asks for sudo). A machine whose docker answers needs no podman.
system-deps:
	@wanted="$(SYSTEM_PACKAGES)"; \
	docker info >/dev/null 2>&1 || wanted="$$wanted $(CONTAINER_PACKAGES)"; \
	missing=""; for p in $$wanted; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  sudo_=""; [ "$$(id -u)" = 0 ] || sudo_=sudo; \
	  $$sudo_ apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo_ apt-get install -y -qq --no-install-recommends $$missing; \
	fi

## make bench: the bare-model limit, every batch size (bench/README.md lists the others).
bench: $(BIN)/.dev $(call stamps,$(DEFAULT_HANDLER_DIR))
	$(BIN)/python bench/bare_model.py

## make textgen-model: train the text generator example's model (handlers/textgen/train.py),
## into TEXTGEN_MODEL_DIR or handlers/textgen/model; its setup() does it when missing.
textgen-model: $(BIN)/.runtime $(call stamps,handlers/textgen)
	$(BIN)/python handlers/textgen/train.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info site
