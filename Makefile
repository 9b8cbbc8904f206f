# dpstream — the two set-up commands are `make demo` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint venv bench-noise bench-heavy-hitters bench-counters eval-heavy-hitters eval-prem sipp-batch clean

# Re-install whenever pyproject.toml changes; the stamp keeps repeated `make test` fast.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dpstream needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,embedded,plots,report,files]"
	@touch $(STAMP)

venv: $(STAMP)

# The main job: a simulated SIPP-like panel streamed through the embedded broker and Redis (pipeline/demo.py).
demo: $(STAMP)
	$(VENV)/bin/dpstream demo

# The static checks: ruff (lint and format check) and mypy, configured in pyproject.toml; `make test`
# runs them beside the tests (output in out/lint.log, shown when they fail) and fails if they fail.
lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline jobs
	$(VENV)/bin/ruff format --check pipeline jobs
	$(VENV)/bin/mypy pipeline jobs

# tests/test_metrics.py scrapes the processes with a real Prometheus server (Debian package);
# tests/test_report_page.py opens the analyst page in headless chromium (Debian package).
# TEST_WORKERS processes (pytest-xdist; 3 by default on the 2-core machines: most files that start real
# processes wait on them, e.g. tests/test_stream_e2e.py keeps 0.4 of a core busy; docs/performance.md),
# each test file on one of them (--dist loadfile: a file's module fixtures, e.g. its embedded broker and
# Redis, are started once), the longest files first by the last run's durations in .pytest_cache, else
# the files that start processes (tests/support/file_order.py; --no-loadscope-reorder keeps that
# order); the ten slowest tests are listed at the end.
TEST_WORKERS ?= 3
test: $(STAMP)
	./scripts/install-prometheus.sh
	./scripts/install-chromium.sh
	@mkdir -p out
	@$(MAKE) --no-print-directory lint > out/lint.log 2>&1 & lint=$$!; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10; \
	tests=$$?; \
	if wait $$lint; then echo "make lint passed (out/lint.log)"; \
	else cat out/lint.log; echo "make lint failed"; exit 1; fi; \
	exit $$tests

# Jobs run on demand (not part of `make test`); results and commands are in the README.
bench-noise: $(STAMP)
	$(PY) -m jobs.bench.bench_noise --json out/bench_noise.json

# jax-privacy (the `bench` extra) is the BLT baseline; without it the job says so and goes on.
bench-counters: $(STAMP)
	-$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) -m jobs.bench.bench_counters --json out/bench_counters.json

bench-heavy-hitters: $(STAMP)
	$(PY) -m jobs.bench.bench_heavy_hitters --json out/bench_heavy_hitters.json

eval-heavy-hitters: $(STAMP)
	$(PY) -m jobs.eval.eval_heavy_hitters

eval-prem: $(STAMP)
	$(PY) -m jobs.eval.eval_prem --json out/eval_prem.json

sipp-batch: $(STAMP)
	$(PY) -m jobs.eval.sipp_batch

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis .mypy_cache
