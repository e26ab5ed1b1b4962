"""Outcomes change only with a record: the service, the admin's action (asks why), the change form (cannot
change them), the history shown, and imports (never change a stored run's outcome)."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.errors import NotFound, ValidationError
from experience.exporters.trove_jsonl import dumps
from experience.models import CurationEvent, Trajectory
from experience.services.curation import curation_history, trajectories_outcome_set
from experience.services.importing import trajectories_import_file
from tests.experience.services.store_factories import RunFactory, stored

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/experience/trajectory/"


@pytest.fixture
def root():
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw")


@pytest.fixture
def admin_client_(root):
    client = Client()
    client.force_login(root)
    return client


def outcomes(*ids: int) -> list[tuple]:
    rows = dict((pk, rest) for pk, *rest in Trajectory.objects.values_list("pk", "reward", "success", "status"))
    return [tuple(rows[pk]) for pk in ids]


# --- the service ---------------------------------------------------------------------------------------------


def test_each_run_changed_gets_one_event_with_only_the_fields_that_changed(root):
    a, b, c = stored(RunFactory(reward=1.0, success=True), RunFactory(reward=0.0, success=True),
                     RunFactory(reward=0.0, success=False))

    result = trajectories_outcome_set(trajectories=Trajectory.objects.all(), actor=root, reward=0.0, success=False,
                                      reason="  the evaluator passed an empty test file  ")

    assert (result.matched, result.changed) == (3, 2)
    assert outcomes(a, b, c) == [(0.0, False, "completed")] * 3
    events = {e.trajectory_id: e for e in CurationEvent.objects.all()}
    assert set(events) == {a, b}
    assert (events[a].before, events[a].after) == ({"reward": 1.0, "success": True}, {"reward": 0.0, "success": False})
    assert (events[b].before, events[b].after) == ({"success": True}, {"success": False})
    assert {(e.action, e.actor_id, e.reason) for e in events.values()} == {
        ("set_outcome", root.pk, "the evaluator passed an empty test file")}


@pytest.mark.parametrize(("fields", "field"), [
    ({"reward": 0.0, "reason": ""}, "reason"),
    ({"reward": 0.0, "reason": " \n"}, "reason"),
    ({"reason": "why"}, "reward"),
    ({"reward": math.nan, "reason": "why"}, "reward"),
    ({"reward": math.inf, "reason": "why"}, "reward"),
    ({"reward": True, "reason": "why"}, "reward"),
    ({"reward": "1", "reason": "why"}, "reward"),
    ({"success": 1, "reason": "why"}, "success"),
    ({"status": "running", "reason": "why"}, "status"),
])
def test_a_bad_outcome_edit_names_the_field_and_writes_nothing(root, fields, field):
    (pk,) = stored(RunFactory(reward=1.0, success=True))

    with pytest.raises(ValidationError) as refused:
        trajectories_outcome_set(trajectories=[pk], actor=root, **fields)

    assert refused.value.field == field
    assert outcomes(pk) == [(1.0, True, "completed")] and not CurationEvent.objects.exists()


def test_the_history_of_a_run_is_its_events_newest_first(root):
    a, b = stored(RunFactory(reward=1.0), RunFactory(reward=1.0))
    trajectories_outcome_set(trajectories=[a, b], actor=root, reward=0.5, reason="first")
    trajectories_outcome_set(trajectories=[a], actor=None, status="failed", reason="second")

    history = list(curation_history(trajectory_id=a))

    assert [(e.reason, e.actor_id, e.after) for e in history] == [
        ("second", None, {"status": "failed"}), ("first", root.pk, {"reward": 0.5})]
    with pytest.raises(NotFound):
        curation_history(trajectory_id=10**9)


def test_importing_an_outcome_report_again_never_changes_the_stored_outcome(tmp_path):
    run = RunFactory(source="import", source_ref="report/1", reward=1.0, success=True)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(dumps(run) + "\n")
    second.write_text(dumps(RunFactory(source="import", source_ref="report/1", reward=0.0, success=False)) + "\n")

    trajectories_import_file(path=first)
    report = trajectories_import_file(path=second)

    # reported as changed (issue 17), and still not written without --replace
    assert (report.status, report.present, len(report.changed)) == ("changed", 0, 1)
    assert report.changed[0]["differs"].endswith("reward 1.0 -> 0.0, success True -> False")
    assert list(Trajectory.objects.values_list("reward", "success")) == [(1.0, True)]
    assert not CurationEvent.objects.exists()


# --- the admin -----------------------------------------------------------------------------------------------


def test_the_admin_action_asks_why_then_records_before_after_why_and_who(admin_client_):
    a, b, c = stored(RunFactory(reward=1.0, success=True), RunFactory(reward=1.0, success=True), RunFactory())
    checked = {"action": "curate_set_outcome", "select_across": "0", "_selected_action": [a, b]}

    confirm = admin_client_.post(CHANGELIST, checked)
    no_reason = admin_client_.post(CHANGELIST, {**checked, "apply": "1", "reward": "0", "success": "false"})
    applied = admin_client_.post(CHANGELIST, {**checked, "apply": "1", "reward": "0", "success": "false",
                                              "reason": "reward hacking: it edited the tests"}, follow=True)

    page = confirm.content.decode()
    assert confirm.status_code == 200 and 'name="reason"' in page and 'name="reward"' in page
    assert re.search(r"Change the outcome \(reward, success, status\): <strong>2</strong> trajectories", page)
    assert no_reason.status_code == 200 and "This field is required" in no_reason.content.decode()
    assert "Change the outcome (reward, success, status): 2 of 2 runs changed" in applied.content.decode()
    assert outcomes(a, b, c) == [(0.0, False, "completed")] * 2 + [(None, None, "completed")]
    events = list(CurationEvent.objects.order_by("trajectory_id"))
    assert [(e.trajectory_id, e.action, e.actor.username, e.reason) for e in events] == [
        (a, "set_outcome", "root", "reward hacking: it edited the tests"),
        (b, "set_outcome", "root", "reward hacking: it edited the tests")]
    assert {(str(e.before), str(e.after)) for e in events} == {
        (str({"reward": 1.0, "success": True}), str({"reward": 0.0, "success": False}))}


def test_the_admin_action_refuses_a_reward_that_is_not_a_number(admin_client_):
    (a,) = stored(RunFactory(reward=1.0))

    response = admin_client_.post(CHANGELIST, {"action": "curate_set_outcome", "_selected_action": [a], "apply": "1",
                                               "reward": "lots", "reason": "why"})

    assert "is not a number" in response.content.decode()
    assert outcomes(a) == [(1.0, None, "completed")] and not CurationEvent.objects.exists()


class _FormFields(HTMLParser):
    """What a browser would post for the page's main form: its inputs, textareas and selected options."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "input" and name and attrs.get("type") not in ("submit", "button", "file"):
            if attrs.get("type") in ("checkbox", "radio") and "checked" not in attrs:
                return
            self.data.setdefault(name, []).append(attrs.get("value") or "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.data.setdefault(name, []).append("")
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in attrs:
            self.data.setdefault(self._select, []).append(attrs.get("value") or "")

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea][-1] += data

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None


def change_form_data(page: str) -> dict[str, list[str]]:
    parser = _FormFields()
    parser.feed(page)
    return parser.data


def test_the_change_form_cannot_change_reward_success_status_or_source(admin_client_):
    (pk,) = stored(RunFactory(reward=1.0, success=True))
    url = f"{CHANGELIST}{pk}/change/"
    page = admin_client_.get(url).content.decode()
    data = change_form_data(page)
    assert "task_key" in data  # the page's editable fields were read

    forged = {**data, "reward": ["0.0"], "success": ["false"], "status": ["failed"], "source": ["rollout"],
              "source_ref": ["rollout:1:attempt:1"], "_save": ["Save"]}
    response = admin_client_.post(url, forged)

    assert response.status_code == 302, response.content.decode()[:2000]  # saved: the form took the post
    for name in ("reward", "success", "status", "source", "source_ref"):
        assert f'name="{name}"' not in page
    stored_run = Trajectory.objects.get(pk=pk)
    assert (stored_run.reward, stored_run.success, stored_run.status, stored_run.source) == (
        1.0, True, "completed", "api")
    assert not CurationEvent.objects.exists()


def test_the_change_form_shows_the_outcome_history(admin_client_, root):
    (pk,) = stored(RunFactory(reward=1.0))
    trajectories_outcome_set(trajectories=[pk], actor=root, reward=0.0, reason="replayed: the fix was never applied")

    page = admin_client_.get(f"{CHANGELIST}{pk}/change/").content.decode()

    assert "set_outcome" in page and "replayed: the fix was never applied" in page


def test_the_admin_cannot_add_runs_nor_edit_their_steps(admin_client_):
    (pk,) = stored(RunFactory())
    step = Trajectory.objects.get(pk=pk).steps.first()

    add = admin_client_.post(f"{CHANGELIST}add/", {"source": "rollout", "source_ref": "r", "task_key": "t"})
    edit = admin_client_.post(f"/admin/experience/step/{step.pk}/change/", {"exit_code": "1", "kind": "eval"})
    view = admin_client_.get(f"/admin/experience/step/{step.pk}/change/")

    assert add.status_code == 403 and Trajectory.objects.count() == 1
    assert edit.status_code == 403 and view.status_code == 200
    step.refresh_from_db()
    assert (step.kind, step.exit_code) == ("command", 0)
