# The commands people and CI run. Each target creates the virtualenv and installs what it needs itself.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)# everything the tests need (dev tools, torch, Playwright)
DEMO_STAMP := $(VENV)/.demo-$(HASH)# only what the demo needs
# Tests run on the full stack's real parts: Postgres and Redis on this machine (see .ci/run).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/trove
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# The embedded suite: the demo end to end, and the store, API and pages on SQLite. Left out: what is
# Postgres-only by design (digest triggers, COPY-based builds, context deltas, query counts) and the tests
# that start a Celery worker process on Redis.
EMBEDDED_TESTS ?= tests/integration/test_embedded.py tests/integration/test_demo_stop.py \
  tests/experience tests/webapp/dashboard tests/webapp/api \
  --ignore=tests/experience/services/test_digest_pending.py \
  --ignore=tests/experience/services/test_trajectory_digest.py \
  --ignore=tests/experience/services/test_datasets_build.py \
  --ignore=tests/experience/services/test_ingest_context_delta.py \
  --ignore=tests/webapp/api/test_jobs_live_page.py \
  --deselect=tests/experience/services/test_ingest_live.py::test_an_append_in_time_order_is_four_queries_at_most \
  -k "not enqueued and not api_key_itself and not spec_form_builds and not lists_versions_and_builds and not returns_202 and not planners_estimate"

.PHONY: demo test test-embedded lint typecheck system-deps bench serve

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,embeddings,server]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# The demo installs Trove and its runtime dependencies only (no torch, Playwright or type checkers: those are
# the `embeddings` and `dev` extras), with pip's own progress so a first run says what it is doing.
$(DEMO_STAMP): pyproject.toml
	@if [ -f $(STAMP) ]; then touch $@; exit 0; fi; \
	test -x $(PY) || python3 -m venv $(VENV); \
	echo "Installing Trove into $(VENV) (runtime dependencies only) ..."; \
	$(PY) -m pip install --upgrade pip && $(PY) -m pip install -e . && rm -f $(VENV)/.demo-* && touch $@

# bubblewrap runs the local sandboxes; install it when we can (root on Debian), else say what to do.
system-deps:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2 git >/dev/null; \
	  else echo "Trove needs bubblewrap: sudo apt-get install bubblewrap" >&2; exit 1; fi; }

demo: $(DEMO_STAMP) system-deps
	$(PY) manage.py demo

serve: $(DEMO_STAMP) system-deps
	$(PY) manage.py serve

test: $(STAMP) system-deps
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
	  SECRET_KEY=$${SECRET_KEY:-trove-test-secret} $(VENV)/bin/pytest --durations=25 $(PYTEST_ARGS)
ifeq ($(PYTEST_ARGS),)
	@# The embedded default is what `make demo` runs: its suite goes with every whole run (CI's included).
	$(MAKE) --no-print-directory test-embedded
endif

# The embedded default's own suite: SQLite under a scratch var/, the in-process worker, no Postgres or Redis.
test-embedded: $(STAMP) system-deps
	env -u DATABASE_URL -u REDIS_URL TROVE_VAR_DIR=$$(mktemp -d /tmp/trove-embedded-XXXXXX) \
	  SECRET_KEY=trove-test-secret $(VENV)/bin/pytest --durations=10 $(EMBEDDED_TESTS) $(PYTEST_ARGS)

# Every benchmark in its quick mode, then one table: figure, baseline, ratio, target, verdict.
bench: $(STAMP) system-deps
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
	  SECRET_KEY=$${SECRET_KEY:-trove-test-secret} $(PY) benchmarks/run_all.py --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy experience webapp workers
