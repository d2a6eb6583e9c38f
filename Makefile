# The project's commands. `make test` on a fresh clone runs the set-up first (via the stamp file).
VENV ?= .venv
BIN := $(VENV)/bin
SETUP_STAMP := $(VENV)/.pdserve-setup-done

.PHONY: setup serve test lint protos

setup:
	PDSERVE_VENV=$(VENV) bash scripts/setup.sh

$(SETUP_STAMP): pyproject.toml scripts/setup.sh
	PDSERVE_VENV=$(VENV) bash scripts/setup.sh

serve: $(SETUP_STAMP)
	$(BIN)/pdserve up

test: $(SETUP_STAMP)
	$(BIN)/pytest -q

lint: $(SETUP_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# NOTE: PATH puts the venv first so protoc finds the protoc-gen-mypy plugins installed there.
protos: $(SETUP_STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I protos \
		--python_out=protos --grpc_python_out=protos --mypy_out=protos --mypy_grpc_out=protos \
		protos/pdserve/v1/*.proto
