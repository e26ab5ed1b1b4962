"""Fleet tasks: the reconciler on Celery beat. Thin: ids in, a reconcile round, a report out.

Safe to run twice at once (the round takes a per-fleet advisory lock and skips a fleet another round holds),
so neither beat overlap nor a redelivered message can double up work.
"""

from __future__ import annotations

import logging

from celery import shared_task

from webapp.fleets.models import Fleet
from workers.reconciler import fleet_reconcile

log = logging.getLogger("trove.fleets")


@shared_task(name="trove.fleets.reconcile_all", ignore_result=True, soft_time_limit=240, time_limit=300)
def reconcile_all() -> dict:
    """One round per fleet, in turn. One fleet's failure is logged and does not stop the others."""
    reports = {}
    for fleet_id, name in Fleet.objects.order_by("id").values_list("id", "name"):
        try:
            reports[name] = fleet_reconcile(fleet_id=fleet_id)
        except Exception as error:  # noqa: BLE001 - isolate fleets from each other; the next round retries
            log.exception("fleet %s: reconcile failed", name)
            reports[name] = {"error": str(error)}
    return reports


@shared_task(name="trove.fleets.reconcile", ignore_result=True, soft_time_limit=240, time_limit=300)
def reconcile_fleet(fleet_id: int) -> dict:
    return fleet_reconcile(fleet_id=fleet_id)
