# The project's commands. `make test` on a fresh clone runs the set-up first (via the stamp file).
VENV ?= .venv
BIN := $(VENV)/bin
SETUP_STAMP := $(VENV)/.pdserve-setup-done

.PHONY: setup serve test lint protos compose-e2e

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

protos: $(SETUP_STAMP)
	PYTHON=$(BIN)/python bash scripts/gen_protos.sh

# A real compose run with podman, as root: base images from Debian packages, the image, up, generate, scale decode
# to 2 and back, down (scripts/compose_e2e.sh; docs/deploy.md). Needs no registry but Debian's and PyPI.
compose-e2e:
	bash scripts/compose_e2e.sh
