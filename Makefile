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
# runs them first.
lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline jobs
	$(VENV)/bin/ruff format --check pipeline jobs
	$(VENV)/bin/mypy pipeline jobs

# tests/test_metrics.py scrapes the processes with a real Prometheus server (Debian package);
# tests/test_report_page.py opens the analyst page in headless chromium (Debian package).
# Two processes (pytest-xdist), each test file on one of them (--dist loadfile: a file's module fixtures,
# e.g. its embedded broker and Redis, are started once), the longest files first by the last run's durations
# in .pytest_cache, else the files that start processes (tests/support/file_order.py;
# --no-loadscope-reorder keeps that order); the ten slowest tests are listed at the end.
test: $(STAMP) lint
	./scripts/install-prometheus.sh
	./scripts/install-chromium.sh
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10

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
