# cotenant — the two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PLOTLY := $(VENV)/.plotly-stamp
# the image the manifests under deploy/ run (tests/test_image.py keeps them in step)
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE   ?= cotenant:$(VERSION)

.PHONY: demo test install system-deps lint typecheck unit bench reliability engines image image-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# plotly.js's cartesian bundle from npm into dashboard/vendor/ (a warning, not an error, when
# it cannot be fetched: one attempt per install, not per make); re-checked after every
# install, as an upgraded plotly needs the bundle of its own version
$(PLOTLY): scripts/fetch-plotly-bundle.py $(STAMP)
	$(BIN)/python scripts/fetch-plotly-bundle.py
	touch $(PLOTLY)

install: $(STAMP) $(PLOTLY)

system-deps:
	bash scripts/install-system-deps.sh

## demo: the whole service on a fresh embedded store, fed by a simulated shared GPU
demo: install
	$(BIN)/cotenant demo

## test: lint, type-check and run the whole suite (installs what the tests need)
test: install system-deps lint typecheck unit

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

## unit: the suite on TEST_JOBS processes (pytest-xdist; a file's tests stay on one, so its
## module fixtures are built once): about 9 minutes on two cores against 17 in one
TEST_JOBS ?= 2
unit: install
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

bench: install
	$(BIN)/python bench/ingest.py

## reliability: the reliability suite at full strength (docs/reliability.md): fuzzing with
## FUZZ_EXAMPLES random inputs per fuzz test (9 tests), the kill -9 sequence KILL9_ROUNDS
## times, overload, faults. `make test` runs the same files with a small fixed budget.
FUZZ_EXAMPLES ?= 2000
KILL9_ROUNDS  ?= 10
reliability: install
	COTENANT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) COTENANT_FUZZ_RANDOM=1 \
	COTENANT_KILL9_ROUNDS=$(KILL9_ROUNDS) \
	$(BIN)/python -m pytest -q --timeout 7200 tests/reliability \
		tests/test_group_commit.py tests/e2e/test_backpressure.py

## engines: real Ray Serve, Triton and vLLM on this machine's CPUs, their spans into `cotenant
## serve` and the actuator backends changing them (tests/engines; docs/instrumenting.md,
## "Verified against"). Engines install once into .engines/ (ENGINES=ray,triton leaves out
## vLLM's 3.5 GB); not part of `make test`.
engines: install
	bash scripts/engines.sh $(BIN)/python

## image: the container image of the agent and central serve (Dockerfile; docs/fleet-install.md), built
## with podman on a Debian base that debootstrap makes from the Debian mirror (no base image is
## pulled); BASE_IMAGE=python:3.11-slim builds on a registry's image instead
image:
	bash scripts/build-image.sh $(IMAGE)

## image-test: run the image as the agent (non-root, host /proc read-only) and as central, send
## spans, read a diagnosis (tests/image; skipped, saying why, where podman cannot run). Not part
## of `make test`: `make image` first (minutes the first time)
image-test: install
	IMAGE=$(IMAGE) $(BIN)/python -m pytest -q -rs -s -p no:cacheprovider tests/image

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache tests/artifacts
