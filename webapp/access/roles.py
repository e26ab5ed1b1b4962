"""DESIGN's roles for people: a Django group per role with the model permissions it grants.

Kept in step on every `migrate` (post_migrate, after the permissions exist): a group is created when missing
and given exactly its role's permissions, so a changed role reaches every database. Assign people to roles by
adding them to these groups in the admin. The same roles exist as token presets (`scopes.ROLES`).
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

_VIEW_RUNS = ["experience.view_trajectory", "experience.view_step", "experience.view_curationevent",
              "experience.view_dedupcluster", "experience.view_dataset", "experience.view_datasetversion"]
_VIEW_JOBS = ["rollouts.view_rolloutjob", "rollouts.view_rollout", "rollouts.view_taskset", "rollouts.view_task"]
_VIEW_FLEETS = ["fleets.view_environmenttemplate", "fleets.view_fleet", "fleets.view_sandbox",
                "fleets.view_sandboxevent"]

ROLE_PERMISSIONS: dict[str, list[str]] = {
    "ops": _VIEW_FLEETS + _VIEW_JOBS + ["fleets.add_environmenttemplate", "fleets.add_fleet", "fleets.change_fleet",
                                        "rollouts.change_rolloutjob", "rollouts.change_rollout"],
    "researcher": _VIEW_RUNS + _VIEW_JOBS + _VIEW_FLEETS + [
        "rollouts.add_rolloutjob", "rollouts.change_rolloutjob", "rollouts.add_taskset", "experience.add_dataset",
        "experience.add_datasetversion"],
    "curator": _VIEW_RUNS + ["experience.change_trajectory", "experience.change_dedupcluster",
                             "experience.add_curationevent"],
    "trainer": _VIEW_RUNS + _VIEW_JOBS + ["rollouts.add_rolloutjob"],
}


class MissingPermission(LookupError):
    pass


def role_groups_sync() -> dict[str, Group]:
    """Create or update one group per role with exactly its permissions."""
    groups = {}
    for role, names in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set([_permission(name) for name in names])
        groups[role] = group
    return groups


def _permission(name: str) -> Permission:
    app_label, codename = name.split(".", 1)
    found = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
    if found is None:
        raise MissingPermission(f"role permission {name!r} does not exist (was the model renamed?)")
    return found


def sync_on_migrate(sender, **kwargs) -> None:
    role_groups_sync()
