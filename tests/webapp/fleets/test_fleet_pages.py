"""The fleet pages (server-rendered): login required, counts, hit rate, histograms, hold reasons, the event
log with paging, and the create / scale / drain / move forms. Query counts are pinned."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.fleets.fleet_factories import make_fleet, make_template, warm_rows
from webapp.access.roles import role_groups_sync
from webapp.dashboard.confirm import CONFIRMED
from webapp.fleets import services
from webapp.fleets.models import Fleet, Sandbox, SandboxEvent

S = Sandbox.State
pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(client, django_user_model):
    user = django_user_model.objects.create_user("ops")
    user.groups.add(role_groups_sync()["ops"])
    client.force_login(user)
    return client


def test_the_pages_need_a_login(client):
    fleet = make_fleet()
    for url in ("/fleets/", f"/fleets/{fleet.pk}/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert client.post(f"/fleets/{fleet.pk}/drain/").status_code == 302
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.ACTIVE


def test_the_fleet_list_shows_counts_hit_rate_and_holds_in_a_fixed_number_of_queries(ops, django_assert_num_queries):
    busy = make_fleet(name="busy", max_total=10)
    warm_rows(busy, 3)
    services.sandbox_claim_warm(fleet=busy, holder="r", lease_seconds=60)
    Fleet.objects.filter(pk=busy.pk).update(claims_hit=3, claims_miss=1)
    held = make_fleet(name="held")
    services.fleet_hold(fleet=held, kind=Fleet.HoldKind.PERMANENT, reason="image pull failed: ErrImagePull",
                        retry_in_s=None)
    for i in range(3):
        warm_rows(make_fleet(name=f"more-{i}", max_total=4), 2)

    with django_assert_num_queries(4):  # session, user, fleets with their counts, templates for the form
        response = ops.get("/fleets/")

    html = response.content.decode()
    assert response.status_code == 200
    row = html.split('data-fleet="busy"')[1].split("</tr>")[0]
    assert '<td class="n-warm">2</td>' in row and '<td class="n-leased">1</td>' in row and "75%" in row
    held_row = html.split('data-fleet="held"')[1].split("</tr>")[0]
    assert "holding" in held_row and "ErrImagePull" in held_row


def test_a_fleet_page_shows_where_the_time_goes(ops, django_assert_num_queries):
    fleet = make_fleet(max_total=20)
    rows = warm_rows(fleet, 6)
    now = timezone.now()
    for index, sandbox in enumerate(rows):  # cold starts of 100 ms .. 600 ms
        Sandbox.objects.filter(pk=sandbox.pk).update(requested_at=now - timedelta(seconds=10),
                                                     ready_at=now - timedelta(seconds=10) + timedelta(milliseconds=100 * (index + 1)))
    for _ in range(3):
        claimed = services.sandbox_claim_warm(fleet=fleet, holder="r", lease_seconds=60, started=0.0)
        services.sandbox_exec_recorded(sandbox=claimed, command="true", exit_code=0, duration_ms=1.0, first=True)

    # session, user, fleet with counts, events page, 3 latency samples, templates, live sandboxes
    with django_assert_num_queries(9):
        response = ops.get(f"/fleets/{fleet.pk}/")

    html = response.content.decode()
    cold = html.split('id="hist-cold_start"')[1].split('id="hist-claim"')[0]
    assert "n = 6" in cold and "p50 <strong class=\"p50\">300.0 ms</strong>" in cold
    assert "100 ms–200 ms" in cold and "500 ms–1 s" in cold
    assert "n = 3" in html.split('id="hist-claim"')[1].split('id="hist-first_exec"')[0]
    assert "n = 3" in html.split('id="hist-first_exec"')[1]
    assert 'data-state="warm">warm <strong>3</strong>' in html and 'data-state="leased">leased <strong>3</strong>' in html
    assert "s3cret-agent-value" not in html


def test_the_event_log_pages_back(ops):
    fleet = make_fleet(max_total=40)
    warm_rows(fleet, 20)  # 60 events
    newest = SandboxEvent.objects.filter(fleet=fleet).order_by("-id")

    first = ops.get(f"/fleets/{fleet.pk}/").content.decode()
    cursor = first.split('id="older" href="?before=')[1].split('"')[0]
    second = ops.get(f"/fleets/{fleet.pk}/?before={cursor}").content.decode()

    assert f"<td>{newest[0].pk}</td>" in first and f"<td>{newest[49].pk}</td>" in first
    assert f"<td>{newest[50].pk}</td>" not in first
    assert f"<td>{newest[50].pk}</td>" in second and f"<td>{newest[59].pk}</td>" in second
    assert 'id="older"' not in second


def test_a_fleet_is_created_from_the_form(ops):
    template = make_template(name="py")
    response = ops.post("/fleets/", {"name": "web-tasks", "template": template.pk, "backend": "local", "min_warm": 1,
                                     "max_warm": 2, "max_total": 4, "sizing": "fixed", "miss_policy": "wait"})
    fleet = Fleet.objects.get(name="web-tasks")
    assert response.status_code == 302 and response["Location"] == f"/fleets/{fleet.pk}/"
    assert (fleet.template, fleet.min_warm, fleet.miss_policy) == (template, 1, "wait")


def test_a_bad_create_form_shows_the_error_and_creates_nothing(ops):
    template = make_template()
    response = ops.post("/fleets/", {"name": "x", "template": template.pk, "backend": "local", "min_warm": 5,
                                     "max_warm": 2, "max_total": 4, "sizing": "fixed", "miss_policy": "cold"})
    assert response.status_code == 200 and "min_warm: must not exceed max_warm" in response.content.decode()
    assert not Fleet.objects.exists()


def test_scale_drain_and_move_from_the_fleet_page(ops):
    fleet = make_fleet(min_warm=0, max_warm=2, max_total=4)
    v2 = services.template_revise(template=fleet.template, pids=64)

    asked = ops.post(f"/fleets/{fleet.pk}/drain/").content.decode()  # drain asks first, naming what it does
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.ACTIVE and "Drain the fleet" in asked
    ops.post(f"/fleets/{fleet.pk}/drain/", {"confirmed": CONFIRMED})
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.DRAINING
    page = ops.post(f"/fleets/{fleet.pk}/scale/", {"min_warm": 1, "max_warm": 3, "max_total": 6,
                                                    "refill_per_minute": 30}, follow=True).content.decode()
    fleet.refresh_from_db()
    assert (fleet.status, fleet.min_warm, fleet.max_warm, fleet.refill_per_minute) == ("active", 1, 3, 30)
    assert f"Fleet {fleet.name} scaled." in page
    refused = ops.post(f"/fleets/{fleet.pk}/scale/", {"min_warm": 9, "max_warm": 3, "max_total": 6,
                                                       "refill_per_minute": 30}, follow=True).content.decode()
    assert "min_warm: must not exceed max_warm" in refused
    moving = ops.post(f"/fleets/{fleet.pk}/template/", {"template": v2.pk}).content.decode()  # asks first
    fleet.refresh_from_db()
    assert fleet.template != v2 and "replace its 0 warm sandboxes" in moving
    ops.post(f"/fleets/{fleet.pk}/template/", {"template": v2.pk, "confirmed": CONFIRMED})
    fleet.refresh_from_db()
    assert fleet.template == v2 and fleet.min_warm == 1


def test_scaling_down_asks_first_and_says_what_it_ends(ops):
    fleet = make_fleet(min_warm=2, max_warm=4, max_total=8)
    warm_rows(fleet, 3)
    sizes = {"min_warm": 0, "max_warm": 1, "max_total": 8, "refill_per_minute": 30}

    asked = ops.post(f"/fleets/{fleet.pk}/scale/", sizes).content.decode()
    fleet.refresh_from_db()
    assert (fleet.min_warm, fleet.max_warm) == (2, 4) and "Scale it down" in asked
    assert "lower max_warm from 4 to 1: warm sandboxes above it are terminated (2 of the 3 warm now)" in asked
    assert "lower min_warm from 2 to 0" in asked and "lower max_total" not in asked  # it stays at 8

    ops.post(f"/fleets/{fleet.pk}/scale/", {**sizes, "confirmed": CONFIRMED})
    fleet.refresh_from_db()
    assert (fleet.min_warm, fleet.max_warm) == (0, 1)


def test_a_held_fleet_shows_why(ops):
    fleet = make_fleet()
    services.fleet_hold(fleet=fleet, kind=Fleet.HoldKind.CAPACITY, reason="no capacity: 2 sandbox(es) unschedulable",
                        retry_in_s=60)
    html = ops.get(f"/fleets/{fleet.pk}/").content.decode()
    assert 'id="hold"' in html and "no capacity on the backend" in html
    assert "no capacity: 2 sandbox(es) unschedulable" in html
