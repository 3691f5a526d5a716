# The two commands a newcomer needs: `make run` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned first: a CPU build of 2.13.0 is what this project is tested with, and any
# other torch requirement would pull several GB of CUDA packages on a machine without a GPU.
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
CONFIG ?= deploy/dev.toml

.PHONY: install run test clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[test,ray]"
	touch $(STAMP)

run: install
	$(BIN)/fleetd serve --config $(CONFIG)

# Two test processes (pytest-xdist), each running whole modules, the end-to-end ones handed out
# first (tests/conftest.py); TEST_PROCESSES=1 runs the suite in one, in its order: see the README.
TEST_PROCESSES ?= 2
XDIST := $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder)

test: install
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
