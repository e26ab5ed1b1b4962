"""Seeding the demo: the demo task set, a local fleet, an admin login. Idempotent (safe to run again)."""

from __future__ import annotations

from dataclasses import asdict

from django.contrib.auth import get_user_model

from webapp.fleets import services as fleet_services
from webapp.fleets.models import EnvironmentTemplate, Fleet
from webapp.rollouts.endpoints import endpoint_fields_clean
from webapp.rollouts.models import ModelEndpoint, TaskSet
from webapp.rollouts.services import taskset_upsert
from workers.demo.model import TOKEN_CAPTURE as DEMO_TOKEN_CAPTURE
from workers.demo.tasks import load_demo_tasks

DEMO_TASK_SET = "demo-python-bugfix"
DEMO_FLEET = "local-demo"
DEMO_TEMPLATE = "python-bubblewrap"
DEMO_USER, DEMO_PASSWORD = "admin", "trove-demo"
DEMO_MODEL_NAME = "trove-demo-stand-in"
DEMO_ENDPOINT = "demo-model"


def seed_demo_task_set() -> TaskSet:
    tasks = []
    for task in load_demo_tasks():
        data = asdict(task)
        tasks.append({
            "key": data["key"], "title": data["title"], "instruction": data["instruction"],
            "difficulty": data["difficulty"], "eval_command": data["eval_command"],
            "eval_timeout_s": data["eval_timeout_s"], "setup_commands": data["setup_commands"],
            "files": data["files"], "eval_files": data["eval_files"],
        })
    return taskset_upsert(name=DEMO_TASK_SET, source="demo", tasks=tasks,
                          description="Small real Python bug-fix tasks shipped with Trove (workers/demo/tasks).")


def seed_local_fleet(*, name: str = DEMO_FLEET, min_warm: int = 2, max_warm: int = 8, max_total: int = 16) -> Fleet:
    fleet = Fleet.objects.filter(name=name).first()
    if fleet:
        return fleet
    template = EnvironmentTemplate.objects.filter(name=DEMO_TEMPLATE).order_by("-version").first()
    if template is None:
        template = fleet_services.template_create(
            name=DEMO_TEMPLATE, cpu=1.0, memory_mb=1024, pids=256, network="none",
            max_lifetime_s=3600, idle_timeout_s=900,
        )
    return fleet_services.fleet_create(name=name, template=template, backend="local",
                                       min_warm=min_warm, max_warm=max_warm, max_total=max_total)


def seed_demo_endpoint(base_url: str, *, name: str = DEMO_ENDPOINT, model_name: str = DEMO_MODEL_NAME,
                       description: str = "The offline demo model: a stand-in for a real model server.",
                       token_capture: str = DEMO_TOKEN_CAPTURE) -> ModelEndpoint:
    """The demo model's endpoint, pointed at `base_url` (its port is chosen when it starts, so this runs each
    time). It listens on loopback, so it is registered the one way that allows it: explicitly, by the admin
    who runs the demo (allow_private_network). No key. With the token capture the demo model answers, so the
    demo's runs give exact RL samples; `token_capture="off"` for a server that may not (`--model-url`).
    Idempotent."""
    fields = endpoint_fields_clean(name=name, base_url=base_url, protocol=ModelEndpoint.Protocol.CHAT,
                                   model_names=[model_name], allow_private_network=True, token_capture=token_capture)
    endpoint, _ = ModelEndpoint.objects.update_or_create(name=name, defaults={**fields, "description": description})
    return endpoint


def seed_admin() -> tuple[str, str]:
    User = get_user_model()
    user, created = User.objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True})
    if created:
        user.set_password(DEMO_PASSWORD)
        user.save()
    return DEMO_USER, DEMO_PASSWORD
