"""Registered model endpoints outside the API: the key-reference allow-list as the proxy reads it, the admin's
form, `manage.py endpoint add|list`, the demo endpoint, and the migration that moved existing jobs onto
endpoints."""

from __future__ import annotations

import hashlib
import os
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from experience.errors import Forbidden, ValidationError
from tests.webapp.rollouts.jobs_factories import make_endpoint, make_fleet, make_job
from webapp.rollouts.endpoints import KeyUnavailable, endpoint_register, key_resolve
from webapp.rollouts.models import ModelEndpoint, RolloutJob
from workers.seed import DEMO_ENDPOINT, DEMO_MODEL_NAME, seed_demo_endpoint

pytestmark = pytest.mark.django_db


def test_an_allowed_env_reference_reads_its_variable(monkeypatch):
    monkeypatch.setenv("TROVE_MODEL_KEY_LAB", " sk-lab-key \n")

    assert key_resolve("env:TROVE_MODEL_KEY_LAB") == "sk-lab-key"
    assert key_resolve("") == ""


def test_an_allowed_reference_whose_key_is_missing_says_so(monkeypatch, settings, tmp_path):
    monkeypatch.delenv("TROVE_MODEL_KEY_GONE", raising=False)
    settings.TROVE_MODEL_SECRETS_DIR = str(tmp_path)

    with pytest.raises(KeyUnavailable, match="TROVE_MODEL_KEY_GONE is not set"):
        key_resolve("env:TROVE_MODEL_KEY_GONE")
    with pytest.raises(KeyUnavailable, match="cannot read missing"):
        key_resolve("file:missing")


@pytest.mark.parametrize("reference", ["env:SECRET_KEY", "env:DATABASE_URL", "env:HOME", "file:/etc/passwd",
                                       "file:../passwd", "file:sub/dir", "file:..", "plain-text-key"])
def test_the_server_own_secrets_cannot_be_named(reference, settings, tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "django-secret")
    settings.TROVE_MODEL_SECRETS_DIR = str(tmp_path / "secrets")
    os.mkdir(tmp_path / "secrets")

    with pytest.raises(ValidationError) as refused:
        key_resolve(reference)

    assert refused.value.field == "key_ref" and "django-secret" not in refused.value.message


def test_the_prefix_is_a_setting(settings, monkeypatch):
    settings.TROVE_MODEL_KEY_ENV_PREFIX = "LAB_KEYS_"
    monkeypatch.setenv("LAB_KEYS_VLLM", "sk-vllm")

    assert key_resolve("env:LAB_KEYS_VLLM") == "sk-vllm"
    with pytest.raises(ValidationError, match="starting with LAB_KEYS_"):
        key_resolve("env:TROVE_MODEL_KEY_VLLM")


def test_file_references_need_the_secrets_directory(settings):
    settings.TROVE_MODEL_SECRETS_DIR = ""

    with pytest.raises(ValidationError, match="TROVE_MODEL_SECRETS_DIR"):
        endpoint_register(name="x", base_url="http://93.184.216.34/v1", protocol="chat", model_names=["m"],
                          key_ref="file:key")


def test_a_job_names_only_a_model_its_endpoint_serves():
    endpoint = make_endpoint(model_names=["policy-a", "policy-b"])

    assert make_job(["t"], endpoint=endpoint).model_name == "policy-a"
    assert make_job(["t"], endpoint=endpoint, model_name="policy-b").model_name == "policy-b"
    with pytest.raises(ValidationError, match="serves policy-a, policy-b") as refused:
        make_job(["t"], endpoint=endpoint, model_name="gpt-5")
    assert refused.value.field == "model_name"


def test_the_command_adds_and_lists_endpoints(monkeypatch):
    monkeypatch.delenv("TROVE_MODEL_KEY_VLLM", raising=False)
    out, err = StringIO(), StringIO()

    call_command("endpoint", "add", "lab-vllm", "--url", "http://10.0.0.7:8000/v1/", "--model", "qwen3-8b",
                 "--model", "qwen3-32b", "--key-ref", "env:TROVE_MODEL_KEY_VLLM", "--allow-private-network",
                 stdout=out, stderr=err)
    call_command("endpoint", "list", stdout=out)

    endpoint = ModelEndpoint.objects.get(name="lab-vllm")
    assert (endpoint.base_url, endpoint.model_names, endpoint.allow_private_network) == (
        "http://10.0.0.7:8000/v1", ["qwen3-8b", "qwen3-32b"], True)
    assert "TROVE_MODEL_KEY_VLLM is not set" in err.getvalue(), "a key that cannot be read yet is flagged"
    assert "lab-vllm\tchat\thttp://10.0.0.7:8000/v1\tqwen3-8b,qwen3-32b" in out.getvalue()


def test_the_command_refuses_a_private_address_without_the_flag_and_a_server_secret():
    with pytest.raises(CommandError, match="private address"):
        call_command("endpoint", "add", "lab", "--url", "http://10.0.0.7:8000/v1", "--model", "m")
    with pytest.raises(CommandError, match="TROVE_MODEL_KEY_"):
        call_command("endpoint", "add", "lab", "--url", "http://10.0.0.7:8000/v1", "--model", "m",
                     "--allow-private-network", "--key-ref", "env:SECRET_KEY")
    assert not ModelEndpoint.objects.exists()


@pytest.fixture
def admin_client_():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def admin_form(**fields) -> dict:
    return {"name": "hosted", "base_url": "https://93.184.216.34/v1", "protocol": "chat",
            "model_names": '["gpt-4.1-mini"]', "key_ref": "", "description": "", "token_capture": "off",
            "policy_version_from": "", **fields}


def test_the_admin_form_runs_the_same_checks(admin_client_):
    refused_key = admin_client_.post("/admin/rollouts/modelendpoint/add/", admin_form(key_ref="env:SECRET_KEY"))
    refused_address = admin_client_.post("/admin/rollouts/modelendpoint/add/",
                                         admin_form(base_url="http://169.254.169.254/latest"))
    refused_capture = admin_client_.post("/admin/rollouts/modelendpoint/add/",
                                         admin_form(protocol="messages", token_capture="vllm"))
    created = admin_client_.post("/admin/rollouts/modelendpoint/add/", admin_form(key_ref="env:TROVE_MODEL_KEY_X"))

    assert refused_key.status_code == 200 and "TROVE_MODEL_KEY_" in refused_key.content.decode()
    assert refused_capture.status_code == 200 and "speaks messages" in refused_capture.content.decode()
    assert refused_address.status_code == 200 and "link-local" in refused_address.content.decode()
    assert created.status_code == 302
    endpoint = ModelEndpoint.objects.get()
    assert (endpoint.name, endpoint.key_ref, endpoint.created_by.username) == ("hosted", "env:TROVE_MODEL_KEY_X", "root")


@pytest.fixture
def ops_staff_client():
    """Someone in the ops role with access to the admin (staff), who is not an admin (not a superuser)."""
    from webapp.access.roles import role_groups_sync

    user = get_user_model().objects.create_user("ops-staff", password="pw", is_staff=True)
    user.groups.add(role_groups_sync()["ops"])
    client = Client()
    client.force_login(user)
    return client


def test_in_the_admin_only_an_admin_may_allow_private_networks(ops_staff_client, admin_client_):
    """The attack through the admin: an ops account ticks allow_private_network on a new endpoint, or moves an
    endpoint that already has it to the metadata service. The flag is read-only for it, and so is such an
    endpoint's address."""
    refused = ops_staff_client.post("/admin/rollouts/modelendpoint/add/",
                                    admin_form(base_url="http://169.254.169.254/latest", allow_private_network="on"))
    public = ops_staff_client.post("/admin/rollouts/modelendpoint/add/", admin_form(allow_private_network="on"))
    lab = endpoint_register(name="lab", base_url="http://10.0.0.7:8000/v1", protocol="chat", model_names=["m"],
                            allow_private_network=True)
    moved = ops_staff_client.post(f"/admin/rollouts/modelendpoint/{lab.pk}/change/",
                                  admin_form(name="lab", base_url="http://169.254.169.254/latest", description="x"))
    by_admin = admin_client_.post(f"/admin/rollouts/modelendpoint/{lab.pk}/change/",
                                  admin_form(name="lab", base_url="http://10.0.0.8:8000/v1", allow_private_network="on"))

    assert refused.status_code == 200 and "link-local" in refused.content.decode()
    assert public.status_code == 302 and ModelEndpoint.objects.get(name="hosted").allow_private_network is False
    assert moved.status_code == 302, moved.content.decode()[:2000]
    lab.refresh_from_db()
    assert by_admin.status_code == 302 and lab.base_url == "http://10.0.0.8:8000/v1" and lab.allow_private_network
    assert ModelEndpoint.objects.filter(base_url__contains="169.254").count() == 0


def test_registering_with_private_networks_is_an_admins_decision():
    ops = get_user_model().objects.create_user("ops-person")
    admin = get_user_model().objects.create_superuser("an-admin")

    with pytest.raises(Forbidden, match="only an admin"):
        endpoint_register(name="x", base_url="http://127.0.0.1:9/v1", protocol="chat", model_names=["m"],
                          allow_private_network=True, created_by=ops)
    by_admin = endpoint_register(name="y", base_url="http://127.0.0.1:9/v1", protocol="chat", model_names=["m"],
                                 allow_private_network=True, created_by=admin)
    by_shell = endpoint_register(name="z", base_url="http://127.0.0.1:9/v1", protocol="chat", model_names=["m"],
                                 allow_private_network=True)

    assert by_admin.allow_private_network and by_shell.allow_private_network
    assert not ModelEndpoint.objects.filter(name="x").exists()


def test_the_demo_endpoint_is_registered_on_loopback_explicitly_and_follows_the_demo_model():
    first = seed_demo_endpoint("http://127.0.0.1:8002/v1")
    again = seed_demo_endpoint("http://127.0.0.1:9100/v1/")

    assert first.pk == again.pk and again.name == DEMO_ENDPOINT
    assert (again.base_url, again.allow_private_network, again.model_names, again.key_ref) == (
        "http://127.0.0.1:9100/v1", True, [DEMO_MODEL_NAME], "")


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_existing_jobs_onto_endpoints_and_drops_their_key_references():
    fleet_id = make_fleet().pk  # fleets' tables stay as they are: only the rollouts app goes back
    executor = MigrationExecutor(connection)
    before = [("rollouts", "0004_task_protected_paths_eval_files")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    task_set = old.get_model("rollouts", "TaskSet").objects.create(name="legacy-set")
    task = old.get_model("rollouts", "Task").objects.create(task_set=task_set, key="t", instruction="i",
                                                            eval_command="true")
    Job = old.get_model("rollouts", "RolloutJob")
    jobs = [Job.objects.create(task_set=task_set, fleet_id=fleet_id, model_base_url=url, model_name=model,
                               api_key_ref=ref)
            for url, model, ref in [("http://vllm.lab:8000/v1", "qwen", "env:SECRET_KEY"),
                                    ("http://vllm.lab:8000/v1", "llama", ""),
                                    ("https://api.example.com/v1", "gpt", "file:/etc/shadow")]]
    old.get_model("rollouts", "Rollout").objects.create(job=jobs[0], task=task, sample_index=0, token="plain-token")

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    endpoints = {e.base_url: e for e in ModelEndpoint.objects.all()}
    assert set(endpoints) == {"http://vllm.lab:8000/v1", "https://api.example.com/v1"}
    lab = endpoints["http://vllm.lab:8000/v1"]
    assert (lab.name, lab.model_names, lab.key_ref, lab.allow_private_network) == (
        "legacy-vllm-lab-8000", ["llama", "qwen"], "", False)
    assert endpoints["https://api.example.com/v1"].key_ref == ""
    assert [RolloutJob.objects.get(pk=job.pk).endpoint_id for job in jobs] == [lab.pk, lab.pk,
                                                                                endpoints["https://api.example.com/v1"].pk]
    from webapp.rollouts.models import Rollout

    assert Rollout.objects.get(job_id=jobs[0].pk).token == hashlib.sha256(b"plain-token").hexdigest()
