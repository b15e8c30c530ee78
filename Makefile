# Two commands for a newcomer: `make run` (one node on 127.0.0.1:9092) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test bench clean

$(BIN)/mink: pyproject.toml setup.py mink/protocol/_record_walk.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(BIN)/mink
	$(BIN)/mink dev

# pytest's exit code 5 ("no tests ran") fails like any other failure.
test: $(BIN)/mink
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(BIN)/mink
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mink .pytest_cache .hypothesis
