"""The attacks on the importers, performed for real: a zip bomb (honest, and with a header that understates its
size), a JSON document 200,000 levels deep, and an upload over the body limit — through the importers, the API
and the dashboard's upload page. Each must end as an error naming the file, with nothing written and the
process's memory untouched by the inflation."""

from __future__ import annotations

import json
import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

from experience.importers import ImportFormatError, detect_format, read_all
from experience.importers.limits import MAX_JSON_DEPTH, MIB, ArchiveBudget, LimitBreached, read_member
from experience.models import Trajectory

HEADER = {"version": 2, "status": "success", "eval": {"task": "bomb", "model": "m", "eval_id": "e1"}}
DEPTH = 200_000


def eval_zip(path: Path, *, inflated: int, method: int = zipfile.ZIP_DEFLATED) -> Path:
    """An Inspect .eval whose one sample member is `inflated` bytes of spaces: deflate packs it ~1000:1."""
    with zipfile.ZipFile(path, "w", method) as archive:
        archive.writestr("header.json", json.dumps(HEADER))
        with archive.open("samples/1_epoch_1.json", "w", force_zip64=True) as member:
            chunk = b" " * MIB
            for _ in range(inflated // MIB):
                member.write(chunk)
    return path


def understate_size(path: Path, member: str, declared: int) -> None:
    """Rewrite the member's uncompressed size in the central directory (the size zipfile trusts)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:  # central directory headers: the name follows the 46-byte fixed part
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46:at + 46 + name_length]) == member.encode():
            break
        at = data.find(b"PK\x01\x02", at + 4)
    assert at != -1
    struct.pack_into("<I", data, at + 24, declared)
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo(member).file_size == declared


def deep_json(depth: int = DEPTH) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_inspect_log(depth: int = DEPTH) -> bytes:
    """A JSON Inspect log (detected as one) whose first sample's input nests `depth` lists deep."""
    head = json.dumps({**HEADER, "samples": [{"id": 1, "input": "@"}]}).encode()
    return head.replace(b'"@"', deep_json(depth))


# --- the importers ------------------------------------------------------------------------------------------


def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path):
    bomb = eval_zip(tmp_path / "bomb.eval", inflated=400 * MIB)
    assert bomb.stat().st_size < 1 * MIB  # what was uploaded: ~400 KB

    tracemalloc.start()
    with pytest.raises(ImportFormatError) as refused:
        read_all(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    assert refused.value.path.name == "bomb.eval"
    assert "samples/1_epoch_1.json" in refused.value.message and "over the limit of 67108864 per member" in refused.value.message
    assert peak < 16 * MIB


def test_a_bomb_whose_header_understates_its_size_is_stopped_while_it_streams(tmp_path):
    """The header is the attacker's: it says 40 MiB (under the member limit), the member inflates far past
    the ratio limit, and reading stops at the first chunk over it."""
    bomb = eval_zip(tmp_path / "liar.eval", inflated=60 * MIB)
    understate_size(bomb, "samples/1_epoch_1.json", 40 * MIB)

    tracemalloc.start()
    with pytest.raises(ImportFormatError) as refused:
        read_all(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    assert "liar.eval" in refused.value.message and "inflates more than 100:1" in refused.value.message
    assert peak < 16 * MIB


def test_the_archive_total_is_counted_across_members(tmp_path):
    path = tmp_path / "many.eval"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for index in range(3):
            archive.writestr(f"samples/{index}_epoch_1.json", b"0" * MIB)
    budget = ArchiveBudget(archive_bytes=path.stat().st_size, max_total=2 * MIB + 1)
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        read_member(archive, infos[0], budget)
        read_member(archive, infos[1], budget)
        with pytest.raises(LimitBreached, match="in all, the limit per archive"):
            read_member(archive, infos[2], budget)


def test_members_compressed_other_than_deflate_are_refused(tmp_path):
    """bzip2 and lzma decompress a whole input chunk at once, so the count could not stop them in time."""
    bomb = eval_zip(tmp_path / "bz.eval", inflated=2 * MIB, method=zipfile.ZIP_BZIP2)
    with pytest.raises(ImportFormatError, match="compression method 12 is not read"):
        read_all(bomb)


def test_json_200000_levels_deep_is_a_format_error_naming_the_file(tmp_path):
    log = tmp_path / "deep-log.json"
    log.write_bytes(deep_inspect_log())
    assert detect_format(log) == "inspect"
    with pytest.raises(ImportFormatError, match=f"deep-log.json: JSON nested deeper than {MAX_JSON_DEPTH} levels"):
        read_all(log)

    bare = tmp_path / "brackets.json"
    bare.write_bytes(deep_json())
    with pytest.raises(ImportFormatError, match="brackets.json: format not recognised.*nested deeper"):
        detect_format(bare)


def test_json_just_past_the_limit_is_refused_too(tmp_path):
    """Below Python's recursion limit the parser would take it, and the walks after it would not."""
    log = tmp_path / "fairly-deep.json"
    log.write_bytes(deep_inspect_log(MAX_JSON_DEPTH + 1))
    with pytest.raises(ImportFormatError, match="nested deeper"):
        read_all(log)
    at_limit = tmp_path / "at-limit.json"
    at_limit.write_bytes(deep_inspect_log(MAX_JSON_DEPTH - 5))
    assert len(read_all(at_limit)) == 1


def test_a_deep_jsonl_line_is_named_by_its_line(tmp_path):
    lines = [json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}),
             deep_json().decode()]
    path = tmp_path / "conversations.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFormatError, match="conversations.jsonl line 2: JSON nested deeper"):
        read_all(path, "openai_messages")


def test_deep_tool_call_arguments_stay_text(tmp_path):
    arguments = deep_json().decode()
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    run = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]}
    path = tmp_path / "calls.jsonl"
    path.write_text(json.dumps(run) + "\n")
    (record,) = read_all(path, "openai_messages")
    stored_calls = [c for step in record.steps for c in (step.tool_calls or [])]
    assert stored_calls[0]["function"]["arguments"] == arguments


# --- through the API and the dashboard -------------------------------------------------------------------------


@pytest.fixture
def researcher(db):
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(Group.objects.get(name="researcher"))
    return user


@pytest.fixture
def api(researcher):
    client = APIClient()
    client.force_authenticate(researcher)
    return client


@pytest.fixture
def browser(researcher):
    client = Client()
    client.force_login(researcher)
    return client


@pytest.fixture
def bomb_bytes(tmp_path) -> bytes:
    return eval_zip(tmp_path / "bomb.eval", inflated=400 * MIB).read_bytes()


def test_the_api_refuses_a_zip_bomb_upload_naming_it(api, bomb_bytes):
    response = api.post("/api/v1/trajectories/import/", {"file": SimpleUploadedFile("bomb.eval", bomb_bytes)},
                        format="multipart")
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "file" and body["files"][0]["status"] == "invalid"
    assert "bomb.eval" in body["detail"] and "zip bomb" in body["detail"]
    assert not Trajectory.objects.exists()


def test_the_api_refuses_a_deep_json_upload_and_a_deep_json_body(api):
    upload = api.post("/api/v1/trajectories/import/",
                      {"file": SimpleUploadedFile("deep-log.json", deep_inspect_log())}, format="multipart")
    assert upload.status_code == 400
    assert "deep-log.json" in upload.json()["detail"] and "nested deeper" in upload.json()["detail"]

    body = api.post("/api/v1/trajectories/", data=b'{"trajectories": ' + deep_json() + b"}",
                    content_type="application/json")
    assert body.status_code == 400
    assert f"deeper than {MAX_JSON_DEPTH} levels" in body.json()["detail"]
    assert not Trajectory.objects.exists()


def test_the_dashboard_upload_refuses_a_zip_bomb_and_deep_json_naming_them(browser, bomb_bytes):
    bomb = browser.post("/trajectories/import/", {"file": SimpleUploadedFile("bomb.eval", bomb_bytes)})
    deep = browser.post("/trajectories/import/", {"file": SimpleUploadedFile("deep-log.json", deep_inspect_log())})

    assert (bomb.status_code, deep.status_code) == (400, 400)
    assert "bomb.eval" in bomb.content.decode() and "zip bomb" in bomb.content.decode()
    assert "nested deeper than" in deep.content.decode()
    assert not Trajectory.objects.exists()


def test_one_body_limit_for_the_api_and_the_dashboard(api, browser, settings, tmp_path):
    """40 MB: the dashboard accepted it while the API refused 32 MiB. Both refuse it now, from one setting,
    and both take a file under it."""
    assert settings.TROVE_MAX_BODY_BYTES == 32 * MIB
    big = b"x" * (40 * 1000 * 1000)

    page = browser.post("/trajectories/import/", {"file": SimpleUploadedFile("big.jsonl", big)})
    endpoint = api.post("/api/v1/trajectories/import/", {"file": SimpleUploadedFile("big.jsonl", big)},
                        format="multipart")

    assert page.status_code == 413 and "exceeds the limit of 33554432 (32 MiB)" in page.content.decode()
    assert endpoint.status_code == 413 and endpoint.json()["field"] == "body"

    settings.TROVE_MAX_BODY_BYTES = 100 * MIB
    allowed = browser.post("/trajectories/import/", {"file": SimpleUploadedFile("big.jsonl", big)})
    assert allowed.status_code == 400 and "big.jsonl" in allowed.content.decode()  # taken, read, and not a trajectory format


# --- the task-set import (JSONL, with workspaces as base64 tar.gz) ------------------------------------------------


def gnu_longname_bomb(inflated: int) -> str:
    """A tar.gz whose first header is a GNU long name `inflated` bytes long (tarfile reads it whole), base64."""
    import base64
    import gzip
    import io
    import tarfile

    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, inflated
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb") as stream:
        stream.write(header.tobuf(format=tarfile.GNU_FORMAT))
        for _ in range(inflated // MIB):
            stream.write(b"a" * MIB)
    return base64.b64encode(packed.getvalue()).decode()


@pytest.fixture
def ops_api(db):
    user = get_user_model().objects.create_user("ops")
    user.groups.add(Group.objects.get(name="ops"))
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_task_set_whose_snapshot_is_a_gzip_bomb_is_refused_before_it_inflates(ops_api):
    from webapp.rollouts.models import TaskSet

    line = json.dumps({"instance_id": "t1", "problem_statement": "fix it", "eval_command": "true",
                       "snapshot_b64": gnu_longname_bomb(300 * MIB)})
    assert len(line) < 2 * MIB
    tracemalloc.start()
    response = ops_api.post("/api/v1/task-sets/", {"name": "bomb", "jsonl": line}, format="json")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    assert response.status_code == 400
    assert "snapshot_b64" in response.json()["detail"] and "gzip bomb" in response.json()["detail"]
    assert peak < 100 * MIB
    assert not TaskSet.objects.filter(name="bomb").exists()


def test_a_task_set_line_200000_levels_deep_is_refused_naming_the_line(ops_api):
    lines = json.dumps({"instance_id": "t1", "problem_statement": "i", "eval_command": "true"}) + "\n" + deep_json().decode()
    response = ops_api.post("/api/v1/task-sets/", {"name": "deep", "jsonl": lines}, format="json")

    assert response.status_code == 400
    assert "line 2" in response.json()["detail"] and "nested deeper than" in response.json()["detail"]


def test_every_importer_parses_json_through_the_bounded_parser():
    """A new importer calling json.loads itself would bring the RecursionError back: catch it here."""
    import re

    import experience.importers as package

    direct = re.compile(r"\b(json|orjson|ujson|simplejson)\.loads?\(")
    offenders = [path.name for path in Path(package.__file__).parent.glob("*.py")
                 if path.name != "limits.py" and direct.search(path.read_text())]
    assert offenders == [], "parse JSON with experience.importers.limits.loads_json (or base.parse_json_bytes)"
