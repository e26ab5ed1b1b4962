from __future__ import annotations

from celery import shared_task

from webapp.fleets.models import Fleet
from workers.reconciler import fleet_reconcile


@shared_task(name="trove.fleets.reconcile_all", ignore_result=True)
def reconcile_all() -> dict:
    return {fleet.name: fleet_reconcile(fleet=fleet) for fleet in Fleet.objects.select_related("template")}


@shared_task(name="trove.fleets.reconcile", ignore_result=True)
def reconcile_fleet(fleet_id: int) -> dict:
    return fleet_reconcile(fleet=Fleet.objects.select_related("template").get(pk=fleet_id))
