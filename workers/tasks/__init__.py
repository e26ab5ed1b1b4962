"""Celery tasks. Thin: take ids, re-fetch, call one service, own the retry policy."""

from workers.tasks import datasets, dedup, fleets, proxy, rollouts, search  # noqa: F401  (registers the tasks)
