"""Dataset tasks. `build` is idempotent (see `dataset_version_build`): a redelivered message for a version
that is ready or failed does nothing, and one for a version another worker is building returns at once,
so it may run with acks_late. A lost database connection is retried with backoff; once out of retries
the version is marked failed so it never stays `building` for ever."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from experience.services.datasets import dataset_version_build, dataset_version_fail, digests_derive_pending

MAX_RETRIES = 3


@shared_task(
    name="trove.datasets.build", bind=True, acks_late=True, ignore_result=True, max_retries=MAX_RETRIES
)
def build_dataset_version(self, version_id: int) -> str | None:
    try:
        version = dataset_version_build(version_id=version_id)
    except (OperationalError, InterfaceError) as error:
        if self.request.retries >= MAX_RETRIES:
            dataset_version_fail(version_id=version_id, error=f"database unavailable: {error}")
            return "failed"
        raise self.retry(exc=error, countdown=10 * 2**self.request.retries) from error
    return version.status if version is not None else None


def enqueue_dataset_build(version_id: int) -> None:
    build_dataset_version.delay(version_id)


@shared_task(name="trove.datasets.digest_pending", acks_late=True, ignore_result=True)
def digest_pending_batch() -> int:
    """Derive the digests of runs stored since the last tick (`digests_derive_pending`), so that value builds
    read them instead of the runs' steps. Idempotent; no retry: the next tick picks up what this one left."""
    return digests_derive_pending()
