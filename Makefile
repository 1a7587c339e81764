# Two commands a newcomer needs:  `make run`  and  `make test`  (see README.md).
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run test lint typecheck unit bench stubs

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $@

install: $(VENV)/.installed

## Run the hooks and admission server locally on http://127.0.0.1:8080
run: install
	$(VENV)/bin/praesto-hooks --bind 127.0.0.1:8080

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(PY) scripts/typecheck.py

unit: install
	$(VENV)/bin/pytest -n 2 $(PYTEST_ARGS)

## Lint, type-check, then the whole test suite (what CI runs)
test: lint typecheck unit

## Regenerate the CSI gRPC stubs from csi/proto/csi.proto
stubs: install
	$(PY) scripts/gen_csi_stubs.py

bench: install
	$(PY) -m bench.all
