# Two commands for a newcomer: `make run` (one node on 127.0.0.1:9092) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test bench chaos clean

$(BIN)/mink: pyproject.toml setup.py mink/protocol/_record_walk.pyx \
		mink/storage/objectstore/_direct_read.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(BIN)/mink
	$(BIN)/mink dev

# pytest's exit code 5 ("no tests ran") fails like any other failure. Two workers
# (pytest-xdist, a module per worker at a time): the suite mostly waits on sockets and
# timers, so it takes about half the time; `make test PYTEST_ARGS=tests/test_x.py` runs one.
PYTEST_ARGS ?= -n 2 --dist loadfile
test: $(BIN)/mink
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(BIN)/mink
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The fault campaign (chaos/README.md): DURATION seconds of faults (FAULTS: a comma list of
# fault classes or groups, see `python -m chaos --help`), reproducible from SEED (random if
# unset, and printed). Exit status 1 on any safety anomaly; results in chaos/results/.
DURATION ?= 120
FAULTS ?= mixed
SEED ?=
chaos: $(BIN)/mink
	$(BIN)/pip install --quiet -e '.[chaos]'
	$(BIN)/python -m chaos --duration $(DURATION) --faults $(FAULTS) $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .mink .pytest_cache .hypothesis
