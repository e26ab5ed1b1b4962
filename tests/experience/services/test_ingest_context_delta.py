"""Model-call contexts stored as deltas on the run's previous call: every reader still gets full contexts.

Bulk ingest stores a context that shares a prefix with the previous model call of the same run as
{"extends": <that step's id>, "keep": n, "append": [...]}; rows with full lists (the streaming path, rows
stored before deltas) stay valid. These tests pin the stored form and that every way of reading back (whole
runs, pages of a run, the timeline, exports, the API) returns exactly the contexts that were ingested.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from experience.exporters import trove_jsonl
from experience.importers import read_all
from experience.models import Step, Trajectory
from experience.records import MessageRecord, StepRecord
from experience.selectors import trajectory_timeline
from experience.services.exporting import export_filters, trajectories_export_to
from experience.services.importing import trajectories_import_file
from experience.services.ingest import steps_append, trajectory_ingest
from experience.services.stored import step_contexts, stored_records, stored_step_records
from experience.steps import (
    canonical_json,
    compact_json,
    context_delta,
    context_length,
    full_contexts,
)
from tests.experience.services.store_factories import T0, run_record, stored
from tests.webapp.api.test_trajectories_api import client_for

pytestmark = pytest.mark.django_db

H = [f"{n:064x}" for n in range(8)]  # stand-in digests for the pure resolver tests


@pytest.fixture
def api():
    return client_for(get_user_model().objects.create_user("reader"))


def contexts_of(steps: list[StepRecord]) -> list[list[MessageRecord] | None]:
    return [step.request_messages for step in steps]


def stored_back(trajectory_id: int):
    ((_, record),) = stored_records(Trajectory.objects.filter(pk=trajectory_id))
    return record


def rows(trajectory_id: int) -> list[Step]:
    return list(Step.objects.filter(trajectory_id=trajectory_id).order_by("seq"))


# --- the stored form --------------------------------------------------------------------------------------------


def test_a_growing_context_is_stored_as_deltas_naming_the_previous_call_by_id():
    (pk,) = stored(run_record(calls=4))

    calls = [s for s in rows(pk) if s.kind == "model_call"]

    assert isinstance(calls[0].blob_refs["request_messages"], list)  # the first call: nothing to extend
    for previous, call in zip(calls, calls[1:], strict=False):
        delta = call.blob_refs["request_messages"]
        assert delta["extends"] == previous.pk and len(delta["append"]) == 2
        assert delta["keep"] == context_length(previous.blob_refs["request_messages"])


def test_a_whole_run_reads_back_exactly_as_ingested():
    run = run_record(calls=6)
    (pk,) = stored(run)

    assert stored_back(pk) == run


def test_a_new_conversation_mid_run_is_stored_in_full_and_reads_back():
    run = run_record(calls=3)
    fresh = [MessageRecord("system", "A different agent."), MessageRecord("user", "Summarise the fix.")]
    shares_system = [run.steps[0].request_messages[0], MessageRecord("user", "Now write the changelog.")]
    run.steps += [
        StepRecord(kind="model_call", request_messages=fresh, response_text="Summary.", call_id="sub-1"),
        StepRecord(kind="model_call", request_messages=shares_system, response_text="Changelog.", call_id="sub-2"),
    ]
    (pk,) = stored(run)

    fresh_row, sharing_row = rows(pk)[-2:]

    assert isinstance(fresh_row.blob_refs["request_messages"], list)  # shares nothing with the call before
    assert isinstance(sharing_row.blob_refs["request_messages"], list)  # nor does this with `fresh`
    assert stored_back(pk) == run


def test_a_context_that_drops_messages_keeps_the_shared_prefix():
    run = run_record(calls=3)
    truncated = run.steps[4].request_messages[:3] + [MessageRecord("user", "Context was trimmed.")]
    run.steps.append(StepRecord(kind="model_call", request_messages=truncated, response_text="ok", call_id="c-t"))
    (pk,) = stored(run)

    delta = rows(pk)[-1].blob_refs["request_messages"]

    assert (delta["keep"], len(delta["append"])) == (3, 1)
    assert stored_back(pk) == run


# --- partial reads --------------------------------------------------------------------------------------------


def test_a_page_of_steps_gets_full_contexts_with_one_query_for_earlier_calls(django_assert_num_queries):
    run = run_record(calls=5)
    (pk,) = stored(run)
    page = rows(pk)[6:]  # starts at the fourth model call: its context extends calls not on the page

    with django_assert_num_queries(2):  # the earlier calls' refs, the blobs
        records = stored_step_records(page)

    assert records == run.steps[6:]


def test_the_steps_api_after_a_seq_returns_full_contexts_and_their_lengths(api):
    run = run_record(calls=4)
    (pk,) = stored(run)

    with_context = api.get(f"/api/v1/trajectories/{pk}/steps/", {"after": 3, "limit": 2, "context": 1}).json()
    without = api.get(f"/api/v1/trajectories/{pk}/steps/", {"after": 3, "limit": 2}).json()

    call = with_context["results"][0]
    assert call["seq"] == 4
    assert [m["content"] for m in call["request_messages"]] == [m.content for m in run.steps[4].request_messages]
    assert without["results"][0]["request_messages"] is None
    assert without["results"][0]["n_request_messages"] == len(run.steps[4].request_messages) == 6


def test_the_timeline_after_a_seq_shows_full_contexts():
    run = run_record(calls=4)
    (pk,) = stored(run)

    timeline = trajectory_timeline(trajectory=Trajectory.objects.get(pk=pk), after_seq=5, limit=1)

    assert timeline[0].record.request_messages == run.steps[6].request_messages


# --- later appends and renumbering --------------------------------------------------------------------------


def test_a_late_call_appended_out_of_order_renumbers_and_every_context_still_reads_back():
    run = run_record(calls=3)
    trajectory, _ = trajectory_ingest(record=run)
    late = StepRecord(kind="model_call", request_messages=run.steps[2].request_messages[:3] + [
        MessageRecord("user", "a late side question")], response_text="side", call_id="late",
        started_at=T0 + timedelta(seconds=1, milliseconds=500))
    after = StepRecord(kind="model_call", request_messages=[*run.steps[4].request_messages, MessageRecord(
        "user", "and then")], response_text="done", call_id="after", started_at=T0 + timedelta(seconds=10))

    steps_append(trajectory_id=trajectory.pk, steps=[late])
    steps_append(trajectory_id=trajectory.pk, steps=[after])

    back = stored_back(trajectory.pk)
    expected = [*run.steps[:2], late, *run.steps[2:], after]  # the late call moved to its place in time
    assert [s.call_id for s in back.steps] == [s.call_id for s in expected]
    assert contexts_of(back.steps) == contexts_of(expected)
    page = rows(trajectory.pk)[3:]  # from the call after the late one
    assert [r.request_messages for r in stored_step_records(page)] == contexts_of(expected)[3:]


# --- older rows and other readers -----------------------------------------------------------------------------


def test_rows_with_full_lists_as_stored_before_deltas_still_read():
    run = run_record(calls=4)
    (pk,) = stored(run)
    steps = rows(pk)
    full = step_contexts(steps)
    for step in steps:  # rewrite every context as the full list older rows hold
        if step.pk in full:
            Step.objects.filter(pk=step.pk).update(blob_refs={**step.blob_refs, "request_messages": full[step.pk]})

    assert stored_back(pk) == run
    assert stored_step_records(rows(pk)[5:]) == run.steps[5:]


def test_an_export_re_imported_gives_the_same_contexts(tmp_path):
    originals = [run_record(calls=5, task_key="a"), run_record(calls=3, task_key="b")]
    stored(*originals)
    path = tmp_path / "runs.jsonl"
    with path.open("wb") as handle:
        trajectories_export_to(filters=export_filters({}), format="trove", fileobj=handle)
    Trajectory.objects.all().delete()

    trajectories_import_file(path=path)

    assert [r.steps for r in read_all(path)] == [r.steps for r in originals]
    again = [record for _, record in stored_records(Trajectory.objects.all())]
    assert [trove_jsonl.record_to_dict(r)["steps"] for r in again] == [
        trove_jsonl.record_to_dict(r)["steps"] for r in originals]


# --- the resolver on its own ------------------------------------------------------------------------------------


def test_context_delta_keeps_the_shared_prefix_or_gives_the_full_list():
    assert context_delta(7, H[:2], H[:4]) == {"extends": 7, "keep": 2, "append": H[2:4]}
    assert context_delta(7, H[:3], [H[0], H[5]]) == {"extends": 7, "keep": 1, "append": [H[5]]}
    assert context_delta(7, H[:3], H[4:6]) == H[4:6]


def test_full_contexts_resolves_chains_in_any_order_and_names_a_missing_base():
    refs = {
        30: {"request_messages": {"extends": 20, "keep": 3, "append": [H[3]]}, "output": H[7]},
        10: {"request_messages": H[:2]},
        20: {"request_messages": {"extends": 10, "keep": 2, "append": [H[2]]}},
        25: {"output": H[6]},
    }

    assert full_contexts(refs) == {10: H[:2], 20: H[:3], 30: H[:4]}
    with pytest.raises(KeyError, match="step 10"):
        full_contexts({30: refs[30], 20: refs[20]})


def test_full_contexts_builds_only_the_contexts_asked_for():
    refs = {1: {"request_messages": [H[0]]}}
    for step_id in range(2, 2000):  # a long run: each call adds a message
        refs[step_id] = {"request_messages": {"extends": step_id - 1, "keep": step_id - 1, "append": [str(step_id)]}}

    contexts = full_contexts(refs, [1999])

    assert list(contexts) == [1999]
    assert contexts[1999] == [H[0], *map(str, range(2, 2000))]


# --- the JSON the bulk path writes ----------------------------------------------------------------------------

_STDLIB_CANONICAL = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False}
AWKWARD = "".join(map(chr, range(0x20))) + '"\\/ \x7f \u2028 é ✓ 😀 \ufeff'


def test_a_message_blob_is_the_same_bytes_it_always_was():
    # the sha256 of these bytes names the blob: a different encoder must not change one byte
    messages = [
        MessageRecord("user", AWKWARD, name="n"),
        MessageRecord("tool", "lone \ud83d surrogate", tool_call_id="t1"),  # orjson refuses: json writes it
        MessageRecord("assistant", "", tool_calls=[{"id": "a", "args": {"x": 1e-07, "y": 10**30}}]),
    ]
    for message in messages:
        expected = json.dumps(message.as_openai(), **_STDLIB_CANONICAL).encode("utf-8", "surrogatepass")
        assert canonical_json(message.as_openai()) == expected


def test_payload_json_reads_back_equal_whatever_encoder_wrote_it():
    for payload in ({"text": AWKWARD, "n": 10**30, "f": 1e-07, "ok": True, "none": None}, {1: "int key"}):
        assert json.loads(compact_json(payload)) == json.loads(json.dumps(payload))
    with pytest.raises(TypeError):  # as json.dumps: a time is not JSON
        compact_json({"at": T0})


def test_steps_with_every_column_empty_or_set_round_trip_through_binary_copy():
    bare = StepRecord(kind="note")
    full = StepRecord(kind="command", started_at=T0, ended_at=T0 + timedelta(seconds=1), duration_ms=7,
                      command="ls", output="x\ty\n\\N", exit_code=-(2**31), tokens_in=2**31 - 1, tokens_out=0,
                      call_id="c1", is_error=True, latency_ms=1.5, payload={"k": [1, 2.5, None]})
    run = run_record(calls=1)
    run.steps += [bare, full]
    (pk,) = stored(run)

    assert stored_back(pk) == run
