"""The pairwise page as a browser posts it: the button pressed decides which run is chosen; a reason is
required; a reader may look but not choose."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.models import PairwisePreference
from tests.experience.services.store_factories import run_record, stored
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


def client_in(role: str | None) -> Client:
    client = Client()
    user = get_user_model().objects.create_user(f"u-{role}")
    if role:
        user.groups.add(role_groups_sync()[role])
    client.force_login(user)
    return client


def test_the_pressed_button_picks_the_chosen_run_and_a_reason_is_needed():
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    curator = client_in("curator")

    page = curator.get("/pairs/", {"task": "t"}).content.decode()
    curator.post("/pairs/", {"a": a, "b": b, "choice": "b", "reason": "", "task": "t"})
    assert not PairwisePreference.objects.exists()
    answer = curator.post("/pairs/", {"a": a, "b": b, "choice": "b", "reason": "shorter", "task": "t"})

    assert f'data-run="{a}"' in page and f'data-run="{b}"' in page
    assert answer["Location"] == "/pairs/?task=t"
    assert PairwisePreference.objects.values_list("chosen_id", "rejected_id", "reason").get() == (b, a, "shorter")


def test_a_reader_looks_but_may_not_choose():
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    reader = client_in(None)

    assert reader.get("/pairs/").status_code == 200
    assert reader.post("/pairs/", {"a": a, "b": b, "choice": "a", "reason": "x"}).status_code == 403
    assert not PairwisePreference.objects.exists()
