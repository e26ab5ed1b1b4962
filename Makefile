# The commands people and CI run. Each target creates the virtualenv and installs what it needs itself.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
# Tests run on the full stack's real parts: Postgres and Redis on this machine (see .ci/run).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/trove
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: demo test test-embedded lint typecheck system-deps bench serve

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,embeddings]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# bubblewrap runs the local sandboxes; install it when we can (root on Debian), else say what to do.
system-deps:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap git >/dev/null; \
	  else echo "Trove needs bubblewrap: sudo apt-get install bubblewrap" >&2; exit 1; fi; }

demo: $(STAMP) system-deps
	$(PY) manage.py demo

serve: $(STAMP) system-deps
	$(PY) manage.py serve

test: $(STAMP) system-deps
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
	  SECRET_KEY=$${SECRET_KEY:-trove-test-secret} $(VENV)/bin/pytest --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy experience webapp workers
