# The two entry points (see README): each sets up what it needs, then runs.
#   make run    the main job: every bundled case on the embedded local model, graded
#   make test   the whole test suite (offline; includes an end-to-end run on the local model and
#               the store tests on a throwaway PostgreSQL server); what CI runs
#   make test-fast  -m "not slow": no model, CLI installs, Ray, PostgreSQL, Chromium or launcher jobs (docs/testing.md)
# ARGS="..." passes extra arguments, e.g. make run ARGS="--env gsm8k", make test ARGS="-k sse".
PY := .venv/bin/python
ARGS ?=

.PHONY: run test test-fast lint setup-run setup-test

run: setup-run
	$(PY) launcher.py --enable-evaluation --pool-size 4 $(ARGS)

test: setup-test
	$(PY) -m pytest -q --durations=25 $(ARGS)

test-fast: setup-test
	$(PY) -m pytest -q -n 4 -m "not slow" --durations=10 $(ARGS)

lint: setup-test
	$(PY) -m ruff check .
	$(PY) -m mypy
	.venv/bin/lint-imports
	$(PY) scripts/docstring_ratio.py --max 0.15 wire gateway store

setup-run:
	@scripts/setup.sh local

setup-test:
	@scripts/setup.sh dev,local,ray,postgres,train,clients
