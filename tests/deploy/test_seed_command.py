"""`manage.py seed`: the documented first-start step of a full-stack install."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_seed_makes_the_demo_task_set_and_a_fleet_once():
    from webapp.fleets.models import Fleet
    from webapp.rollouts.models import TaskSet

    out = StringIO()
    call_command("seed", "--min-warm", "0", stdout=out)
    call_command("seed", "--min-warm", "0", stdout=StringIO())
    task_set = TaskSet.objects.get()
    assert task_set.tasks.count() > 0
    assert Fleet.objects.count() == 1 and Fleet.objects.get().min_warm == 0
    assert f"{task_set.tasks.count()} tasks" in out.getvalue()
