"""The bulk ingest path: idempotent, all or nothing, limits, lossless, blobs stored once."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.utils import timezone

from experience.errors import LimitExceeded, ValidationError
from experience.models import Blob, Step, Trajectory
from experience.records import MessageRecord, StepRecord
from experience.services.blobs import blob_put_many, sha256_hex
from experience.services.ingest import steps_append, trajectories_ingest_many, trajectory_ingest
from experience.services.stored import step_contexts, stored_records
from tests.experience.services.store_factories import RunFactory, StepFactory, run_record, stored

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int, int]:
    return Trajectory.objects.count(), Step.objects.count(), Blob.objects.count()


def test_a_batch_lands_with_its_steps_in_order_and_its_counts():
    first, second = run_record(calls=3), run_record(calls=2)

    outcomes = trajectories_ingest_many(records=[first, second])

    assert [o.created for o in outcomes] == [True, True]
    stored_first = Trajectory.objects.get(pk=outcomes[0].trajectory_id)
    assert (stored_first.n_steps, stored_first.n_model_calls, stored_first.next_seq) == (6, 3, 6)
    assert (stored_first.tokens_in, stored_first.tokens_out) == (100 + 110 + 120, 60)
    assert stored_first.duration_s == 6.0 and stored_first.content_hash
    kinds = list(Step.objects.filter(trajectory=stored_first).order_by("seq").values_list("seq", "kind"))
    assert kinds == [(0, "model_call"), (1, "command"), (2, "model_call"), (3, "command"), (4, "model_call"),
                     (5, "command")]


def test_sending_the_same_batch_again_adds_nothing():
    batch = [run_record(calls=2), run_record(calls=1)]
    first = trajectories_ingest_many(records=batch)
    before = counts()

    again = trajectories_ingest_many(records=batch)

    assert counts() == before
    assert [o.trajectory_id for o in again] == [o.trajectory_id for o in first]
    assert [o.created for o in again] == [False, False]


def test_a_run_repeated_within_one_batch_is_stored_once():
    run = run_record(calls=1)

    outcomes = trajectories_ingest_many(records=[run, run])

    assert [o.created for o in outcomes] == [True, False]
    assert outcomes[0].trajectory_id == outcomes[1].trajectory_id
    assert Trajectory.objects.count() == 1


def test_a_malformed_batch_writes_nothing_and_names_the_field():
    good = run_record(calls=2)
    bad = RunFactory(steps=[StepFactory(), StepFactory(kind="telepathy")])

    with pytest.raises(ValidationError) as caught:
        trajectories_ingest_many(records=[good, bad])

    assert caught.value.field == "trajectories[1].steps[1].kind"
    assert "telepathy" in caught.value.message
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(("change", "field"), [
    ({"tokens_in": -1}, "steps[0].tokens_in"),
    ({"exit_code": "1"}, "steps[0].exit_code"),
    ({"payload": {"command": "shadowed"}}, "steps[0].payload"),
    ({"request_messages": [MessageRecord("user", None)]}, "steps[0].request_messages[0].content"),
])
def test_a_step_of_the_wrong_type_is_refused_by_field(change, field):
    with pytest.raises(ValidationError) as caught:
        trajectory_ingest(record=RunFactory(steps=[StepFactory(**change)]))

    assert caught.value.field == field
    assert counts() == (0, 0, 0)


def test_limits_on_steps_and_content_are_enforced_before_writing(settings):
    settings.TROVE_MAX_STEPS_PER_TRAJECTORY = 3
    settings.TROVE_MAX_CONTENT_CHARS = 100

    with pytest.raises(LimitExceeded) as too_many:
        trajectories_ingest_many(records=[RunFactory(steps=[StepFactory() for _ in range(4)])])
    with pytest.raises(LimitExceeded) as too_long:
        trajectories_ingest_many(records=[RunFactory(), RunFactory(steps=[StepFactory(output="x" * 101)])])

    assert (too_many.value.field, too_many.value.status_code) == ("trajectories[0].steps", 413)
    assert too_long.value.field == "trajectories[1].steps[0].output"
    assert counts() == (0, 0, 0)


def test_run_totals_from_metadata_usage_stand_in_when_steps_carry_no_tokens():
    run = RunFactory(metadata={"usage": {"tokens_in": 5000, "tokens_out": 700, "api_calls": 9}})

    trajectory, _ = trajectory_ingest(record=run)

    assert (trajectory.tokens_in, trajectory.tokens_out) == (5000, 700)


def test_step_tokens_win_over_metadata_usage():
    run = run_record(calls=2, metadata={"usage": {"tokens_in": 1, "tokens_out": 1}})

    trajectory, _ = trajectory_ingest(record=run)

    assert (trajectory.tokens_in, trajectory.tokens_out) == (210, 40)


def test_a_growing_context_stores_each_message_once():
    run = run_record(calls=20)

    trajectory_ingest(record=run)

    # system + task + 20 replies + 20 outputs (the last two never shown to a later call) = 40 messages,
    # plus the large outputs stored as text blobs
    contexts = step_contexts(list(Step.objects.all()))
    message_refs = {h for context in contexts.values() for h in context}
    assert len(message_refs) == 2 + 2 * 19
    assert Blob.objects.filter(sha256__in=message_refs).count() == len(message_refs)


def test_what_is_read_back_equals_what_was_ingested():
    awkward = [
        StepFactory(output=""),  # an empty output stays "", not None
        StepFactory(output="binary \x00 output", command="printf '\\x00'"),  # NUL: not storable inline
        StepFactory(kind="message", text="lone \ud800 surrogate", payload={"role": "user"}, command=None),
        StepFactory(kind="observation", text="long " * 2000, command=None, output=None),
        StepFactory(kind="tool_call", tool_calls=[{"id": "c1", "type": "function",
                                                   "function": {"name": "edit", "arguments": "{}"}}]),
    ]
    runs = [run_record(calls=4), RunFactory(steps=awkward, metadata={"k": [1, 2.5, None]})]

    stored(*runs)

    back = [record for _, record in stored_records(Trajectory.objects.all())]
    assert back == runs


def test_steps_append_skips_call_ids_already_stored():
    trajectory, _ = trajectory_ingest(record=RunFactory(steps=[]))
    call = StepRecord(kind="model_call", response_text="hi", call_id="abc")

    steps_append(trajectory_id=trajectory.pk, steps=[call, StepFactory()])
    steps_append(trajectory_id=trajectory.pk, steps=[call])

    assert list(Step.objects.filter(trajectory=trajectory).values_list("seq", "call_id")) == [(0, "abc"), (1, None)]


def test_numbered_appends_are_idempotent_on_seq_and_refuse_gaps():
    trajectory, _ = trajectory_ingest(record=RunFactory(steps=[]))
    chunk = [StepFactory(command="a"), StepFactory(command="b")]

    steps_append(trajectory_id=trajectory.pk, steps=chunk, first_seq=0)
    steps_append(trajectory_id=trajectory.pk, steps=chunk + [StepFactory(command="c")], first_seq=0)
    with pytest.raises(ValidationError) as gap:
        steps_append(trajectory_id=trajectory.pk, steps=[StepFactory()], first_seq=7)

    commands = [p["command"] for p in Step.objects.filter(trajectory=trajectory).order_by("seq")
                .values_list("payload", flat=True)]
    assert commands == ["a", "b", "c"]
    assert gap.value.field == "first_seq"


postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="concurrent writers on Postgres")


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_writers_sending_the_same_batch_at_once_store_it_once():
    batch = [run_record(calls=3) for _ in range(5)]
    start = threading.Barrier(2)
    results: list = []

    def send() -> None:
        start.wait()
        try:
            results.append(trajectories_ingest_many(records=batch))
        finally:
            connection.close()

    writers = [threading.Thread(target=send) for _ in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)

    assert len(results) == 2
    assert Trajectory.objects.count() == 5 and Step.objects.count() == 5 * 6
    assert sum(o.created for outcomes in results for o in outcomes) == 5
    assert [o.trajectory_id for o in results[0]] == [o.trajectory_id for o in results[1]]


@postgres_only
def test_a_blob_stored_meanwhile_by_another_writer_is_kept_once():
    from experience.services.blobs import COLUMN_TYPES, COLUMNS, _encode
    from experience.services.bulk import copy_ignoring_conflicts

    blob_put_many([b"already there"])
    fresh = {sha256_hex(c): c for c in (b"already there", b"new content")}

    # as if our "which exist?" check ran before the other writer stored the first one
    copy_ignoring_conflicts("experience_blob", COLUMNS, lambda: (
        (d, len(c), *_encode(c), timezone.now()) for d, c in sorted(fresh.items())), conflict="sha256",
        types=COLUMN_TYPES)

    assert sorted(Blob.objects.values_list("sha256", flat=True)) == sorted(fresh)


def test_a_nul_in_a_run_level_text_is_refused_by_field_but_a_literal_escape_is_kept():
    with pytest.raises(ValidationError) as caught:
        trajectory_ingest(record=RunFactory(instruction="bad \x00 byte"))
    trajectory, _ = trajectory_ingest(record=RunFactory(instruction='print("\\u0000")', metadata={"k": "\\u0000"}))

    assert caught.value.field == "instruction"
    trajectory.refresh_from_db()
    assert (trajectory.instruction, trajectory.metadata) == ('print("\\u0000")', {"k": "\\u0000"})
