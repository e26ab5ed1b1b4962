"""The run page's API: step views, the step index, the context lens (checked against the stored contexts),
search within a run, compression; and the run page embeds no context."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from experience.models import Step
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.services.ingest import trajectory_ingest
from experience.services.stored import stored_step_records
from tests.webapp.api.test_trajectories_api import client_for
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
SYSTEM = MessageRecord(role="system", content="You are a coding agent.")
USER = MessageRecord(role="user", content="Fix the slugify bug.")


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("reader")
    user.groups.add(role_groups_sync()["researcher"])
    return client_for(user)


def _call(n: int, context: list[MessageRecord]) -> StepRecord:
    call = {"id": f"call_{n}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": f"ls {n}"})}}
    return StepRecord(kind="model_call", request_messages=list(context), response_text="", tool_calls=[call],
                      tokens_in=10 * n, tokens_out=3, latency_ms=100.0, call_id=f"m{n}",
                      started_at=T0 + timedelta(seconds=2 * n), ended_at=T0 + timedelta(seconds=2 * n, milliseconds=400))


def _run(ref: str = "lens-1", padding: int = 0):
    """Three model calls: the second sees two new messages, the third a context compacted by the harness."""
    reply1 = MessageRecord(role="assistant", content="", tool_calls=[{"id": "call_1", "type": "function",
                                                                      "function": {"name": "bash", "arguments": "{}"}}])
    result1 = MessageRecord(role="tool", content="slugify.py", tool_call_id="call_1")
    summary = MessageRecord(role="user", content="Summary: you listed the files.")
    steps = [
        _call(1, [SYSTEM, USER]),
        StepRecord(kind="command", command="ls 1", output="slugify.py", exit_code=0, payload={"tool_call_id": "call_1"},
                   started_at=T0 + timedelta(seconds=3)),
        _call(2, [SYSTEM, USER, reply1, result1]),
        StepRecord(kind="command", command="ls 2", output="boom", exit_code=2, payload={"tool_call_id": "call_2"},
                   started_at=T0 + timedelta(seconds=5)),
        _call(3, [SYSTEM, summary, MessageRecord(role="tool", content="boom", tool_call_id="call_2")]),
        StepRecord(kind="eval", command="pytest -q", output="1 failed", exit_code=1, text="evaluation failed",
                   payload={"reward": 0.0}, started_at=T0 + timedelta(seconds=8)),
        *(StepRecord(kind="command", command=f"echo {i}", output=str(i), exit_code=0) for i in range(padding)),
    ]
    trajectory, _ = trajectory_ingest(record=TrajectoryRecord(
        source="api", source_format="trove", source_ref=ref, task_key="slugify", steps=steps,
        final_diff="diff --git a/s.py b/s.py\n--- a/s.py\n+++ b/s.py\n@@ -1 +1 @@\n-a\n+b\n"
                   "diff --git a/__pycache__/s.cpython-311.pyc b/__pycache__/s.cpython-311.pyc\nBinary files differ\n"))
    return trajectory


def test_step_views_link_each_call_to_its_result_and_page_on(api, django_assert_max_num_queries):
    trajectory = _run()
    with django_assert_max_num_queries(6):  # token, run, steps, blobs, the link window
        body = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/view/?limit=4").json()
    views = body["results"]
    assert [v["seq"] for v in views] == [0, 1, 2, 3] and body["next_after"] == 3
    assert views[0]["tool_calls"][0]["result_seq"] == 1 and views[1]["call_seq"] == 0
    assert views[3]["failed"] is True and views[3]["exit_code"] == 2
    rest = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/view/?after=3").json()
    assert [v["seq"] for v in rest["results"]] == [4, 5] and rest["next_after"] is None
    by_seq = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/view/?seqs=5,1").json()["results"]
    assert [v["seq"] for v in by_seq] == [1, 5] and by_seq[1]["score"]["passed"] is False


def test_bad_seqs_are_a_400_naming_the_field(api):
    trajectory = _run()
    for seqs in ("1,x", "1,9999999999"):
        response = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/view/?seqs={seqs}")
        assert response.status_code == 400 and "seqs" in json.dumps(response.json())
    assert api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/99999999999/context/").status_code == 404
    assert api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/99999999999/view/").status_code == 404


def test_the_run_page_costs_the_same_queries_whatever_the_run_length(api, client):
    client.force_login(api.user)
    counts = []
    for run in (_run("short"), _run("long", padding=2_000)):
        with CaptureQueriesContext(connection) as queries:
            page = client.get(f"/trajectories/{run.pk}/")
        assert page.status_code == 200 and len(page.content) < 200_000
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_the_index_has_every_step_and_its_jump_marks(api):
    trajectory = _run()
    index = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/index/").json()
    assert index["n"] == 6 and index["seq"] == list(range(6)) and index["timed"] is True
    assert index["marks"] == {"first_error": 3, "first_edit": None, "evals": [5]}
    assert index["dur"][0] == 400.0  # imported steps get their duration from both timestamps


def test_the_index_reads_edits_and_verdicts_from_the_payloads_that_carry_them(api):
    """The index reads a tool call's tool and an evaluation's verdict from the payload, and nothing from other
    kinds' payloads (a model call's, however large, or a command's that happens to name a tool)."""
    steps = [StepRecord(kind="model_call", response_text="", call_id="big", payload={"params": {"tools": ["x" * 50_000]}, "tool": "edit"}),
             StepRecord(kind="command", command="ls", exit_code=0, payload={"tool": "str_replace_editor"}),
             StepRecord(kind="tool_call", text="{}", payload={"tool": "str_replace_editor", "tool_call_id": "t1"}),
             StepRecord(kind="eval", text="wrong", payload={"value": "I", "answer": "4"}),
             StepRecord(kind="eval", text="no", payload={"value": False}),
             StepRecord(kind="eval", text="ok", payload={"success": False, "value": 1.0}),
             StepRecord(kind="eval", text="ok", payload={"value": "C"})]
    trajectory, _ = trajectory_ingest(record=TrajectoryRecord(source="api", source_format="trove", source_ref="verdicts",
                                                              task_key="verdicts", steps=steps))
    index = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/index/").json()
    assert index["flags"] == [0, 0, 2, 1, 1, 1, 0]  # EDIT on the tool call only; FAILED on "I", false, success false
    assert index["marks"] == {"first_error": 3, "first_edit": 2, "evals": [3, 4, 5, 6]}
    assert index["timed"] is False and index["start"] == [None] * 7


def test_the_lens_shows_exactly_the_messages_added_since_the_previous_call(api):
    trajectory = _run()
    lens = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/2/context/").json()
    rows = list(Step.objects.filter(trajectory=trajectory, seq__in=[0, 2]).order_by("seq"))
    before, after = (r.request_messages for r in stored_step_records(rows))
    assert lens["previous_seq"] == 0 and lens["unchanged"] == len(before) and lens["rewrites"] == []
    assert [m["content"] for m in lens["new"]] == [m.content for m in after[len(before):]]
    assert "unchanged_messages" not in lens
    full = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/2/context/?unchanged=1").json()
    assert [m["content"] for m in full["unchanged_messages"]] == [m.content for m in before]


def test_the_lens_says_when_the_harness_rewrote_history(api):
    trajectory = _run()
    lens = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/4/context/").json()
    assert lens["unchanged"] == 1 and [r["kind"] for r in lens["rewrites"]] == ["compacted"]
    assert "+Summary: you listed the files." in lens["rewrites"][0]["diff"]
    # Nothing after the rewrite is shared with the previous call, so all of it is new to the model.
    assert [m["content"] for m in lens["new"]] == ["Summary: you listed the files.", "boom"]
    assert (lens["rewrites"][0]["removed"], lens["rewrites"][0]["at"]) == (3, 1)


def test_the_lens_of_a_step_without_context_is_a_404(api):
    trajectory = _run()
    assert api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/1/context/").status_code == 404


def test_search_within_a_run_finds_commands_and_tool_arguments(api):
    trajectory = _run()
    assert api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/search/?q=LS 2").json() == {"seqs": [2, 3]}
    assert api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/search/?q=").status_code == 400


def test_api_responses_are_compressed(api):
    trajectory = _run()
    response = api.get(f"/api/v1/trajectories/{trajectory.pk}/steps/index/", HTTP_ACCEPT_ENCODING="gzip")
    assert response["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(response.content))["n"] == 6


def test_the_run_page_embeds_the_first_screen_and_no_context(api, client):
    trajectory = _run()
    client.force_login(api.user)
    html = client.get(f"/trajectories/{trajectory.pk}/").content.decode()
    assert "You are a coding agent." not in html and "Summary: you listed" not in html
    config = json.loads(html.split('<script id="run-config" type="application/json">')[1].split("</script>")[0])
    assert [v["seq"] for v in config["first"]] == list(range(6))
    assert [f["path"] for f in config["final_diff"]["files"]] == ["s.py"]
    assert config["final_diff"]["omitted"] == ["__pycache__/s.cpython-311.pyc"]
