"""DESIGN's roles for people: a Django group per role, holding exactly the permissions of its scopes.

The roles and what each scope asks of a user live in scopes.py (ROLES, SCOPE_PERMISSIONS); this module only
keeps the groups in step with them on every `migrate` (post_migrate, after the permissions exist): a group is
created when missing and given exactly its role's permissions, so a changed role reaches every database.
Assign people to roles by adding them to these groups in the admin.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

from webapp.access.scopes import ROLES, SCOPE_PERMISSIONS


def _role_permissions(scopes: tuple[str, ...]) -> list[str]:
    return sorted({name for scope in scopes for name in SCOPE_PERMISSIONS[scope]})


ROLE_PERMISSIONS: dict[str, list[str]] = {role: _role_permissions(scopes) for role, scopes in ROLES.items()}


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
