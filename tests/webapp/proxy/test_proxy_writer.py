"""The database writer of proxy records, on a real Postgres: idempotent, sets aside what it can never write,
raises what a retry can cure."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from django.conf import settings as django_settings
from django.db import OperationalError, close_old_connections, connection, transaction

from experience.models import Step, Trajectory
from tests.webapp.proxy.harness import OK_BODY
from tests.webapp.proxy.rollouts import running_rollout
from tests.webapp.proxy.test_proxy_spool import make_record
from webapp.proxy.locations import dead_letter_path
from webapp.proxy.records import CallRecord
from webapp.proxy.writer import is_transient, write_call_records

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_spool(settings, tmp_path):
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"


def call(trajectory_id: int, call_id: str, answer: str = "ls -la") -> CallRecord:
    response = {**OK_BODY, "choices": [{**OK_BODY["choices"][0], "message": {"role": "assistant", "content": answer}}]}
    return replace(make_record(call_id), trajectory_id=str(trajectory_id), response=response,
                   request={"model": "m", "messages": [{"role": "user", "content": "List the files."}]})


def model_calls(trajectory_id: int) -> list[str]:
    return list(Step.objects.filter(trajectory_id=trajectory_id, kind="model_call")
                .order_by("seq").values_list("call_id", flat=True))


def dead_letters() -> list[dict]:
    path = dead_letter_path()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_records_become_model_call_steps_once_however_often_they_are_written():
    trajectory_id = running_rollout(upstream_v1="http://127.0.0.1:9/v1").trajectory_id
    batch = [call(trajectory_id, "c1"), call(trajectory_id, "c2")]

    first = write_call_records(batch)
    again = write_call_records([*batch, call(trajectory_id, "c1"), call(trajectory_id, "c3")])

    assert model_calls(trajectory_id) == ["c1", "c2", "c3"]
    assert (first.stored, again.stored, again.dead_lettered) == (2, 1, 0)


def test_a_record_whose_trajectory_is_gone_is_set_aside_and_the_rest_are_stored():
    kept = running_rollout(upstream_v1="http://127.0.0.1:9/v1").trajectory_id
    gone = running_rollout(upstream_v1="http://127.0.0.1:9/v1").trajectory_id
    Trajectory.objects.filter(pk=gone).delete()

    outcome = write_call_records([call(gone, "lost-1"), call(kept, "kept-1"), call(gone, "lost-2")])

    assert model_calls(kept) == ["kept-1"]
    assert (outcome.stored, outcome.dead_lettered) == (1, 2)
    letters = dead_letters()
    assert sorted(letter["record"]["call_id"] for letter in letters) == ["lost-1", "lost-2"]
    assert {letter["reason"] for letter in letters} == {"trajectory_gone"}
    assert dead_letter_path().stat().st_mode & 0o777 == 0o600


def test_a_record_the_store_refuses_is_set_aside_alone_and_its_batch_is_stored(settings):
    settings.TROVE_MAX_CONTENT_CHARS = 100
    trajectory_id = running_rollout(upstream_v1="http://127.0.0.1:9/v1").trajectory_id
    batch = [call(trajectory_id, "ok-1"), call(trajectory_id, "too-long", answer="x" * 101), call(trajectory_id, "ok-2")]

    outcome = write_call_records(batch)

    assert model_calls(trajectory_id) == ["ok-1", "ok-2"]
    assert (outcome.stored, outcome.dead_lettered) == (2, 1)
    [letter] = dead_letters()
    assert letter["record"]["call_id"] == "too-long" and letter["reason"] == "LimitExceeded"
    assert "exceeds the limit of 100" in letter["error"]


def test_a_record_with_no_trajectory_id_is_set_aside():
    outcome = write_call_records([replace(make_record("orphan"), trajectory_id="not-a-number")])

    assert outcome.dead_lettered == 1 and dead_letters()[0]["reason"] == "bad_trajectory_id"


@pytest.mark.skipif(django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
                    reason="a lock timeout, the Postgres way")
def test_a_transient_database_error_is_raised_so_the_batch_is_retried_and_nothing_is_set_aside():
    trajectory_id = running_rollout(upstream_v1="http://127.0.0.1:9/v1").trajectory_id
    locked, release = threading.Event(), threading.Event()

    def hold_the_trajectory_lock() -> None:
        with transaction.atomic():
            Trajectory.objects.select_for_update().get(pk=trajectory_id)
            locked.set()
            release.wait(30)
        close_old_connections()
        connection.close()

    holder = threading.Thread(target=hold_the_trajectory_lock)
    holder.start()
    assert locked.wait(10)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    try:
        with pytest.raises(OperationalError) as raised:
            write_call_records([call(trajectory_id, "waits")])
    finally:
        release.set()
        holder.join(10)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert is_transient(raised.value)
    assert model_calls(trajectory_id) == [] and dead_letters() == []
    assert write_call_records([call(trajectory_id, "waits")]).stored == 1  # the retry
    assert model_calls(trajectory_id) == ["waits"]
