"""Registered model endpoints: registering one (checked), naming one in a job, and reading its key.

Key references come from an allow-list, checked when an endpoint is registered and again each time the key
is read, so a row edited in the database or a setting changed since gets no further:
- `env:NAME`: an environment variable whose name starts with TROVE_MODEL_KEY_ENV_PREFIX (`TROVE_MODEL_KEY_` by
  default), so SECRET_KEY, DATABASE_URL and the rest of the process's environment cannot be named;
- `file:NAME`: a file directly inside TROVE_MODEL_SECRETS_DIR, named plainly (no path, no `..`; a symlink that
  leads out of the directory is refused), so no other file the process can read can be named.
Errors name the field and never echo the reference back (someone may have pasted the key itself there).

Addresses: at registration the base URL's host is resolved and refused when it reaches a non-public address
without allow_private_network (a clear error early); the proxy checks again at every connection, which is
the check that holds (webapp/proxy/addresses.py). Only an admin (a superuser, or the server's own shell:
`manage.py endpoint add`, the demo) may allow private networks: an endpoint that may reach loopback,
link-local or private addresses can aim a job's calls at Trove itself or a cloud's metadata service, which an
ops account registering endpoints for its jobs must not be able to do.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from experience.errors import Conflict, Forbidden, NotFound, ValidationError
from webapp.env import env_str
from webapp.proxy.addresses import address_refusal
from webapp.rollouts.models import ModelEndpoint

KEY_REF_SHAPE = "key_ref: must be env:NAME or file:NAME (a reference to the key, never the key itself)"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,99}")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}")
_BODY_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,4}")
Resolver = Callable[..., list[tuple[Any, ...]]]


class KeyUnavailable(ValidationError):
    """An allowed key reference whose key cannot be read now (the variable is unset, the file missing)."""


# --- key references ------------------------------------------------------------------------------------

def key_reference_check(reference: str) -> tuple[str, str]:
    """(scheme, name) of an allowed reference; ValidationError naming `key_ref` otherwise."""
    scheme, _, name = reference.partition(":")
    if scheme == "env" and _ENV_NAME.fullmatch(name):
        prefix = settings.TROVE_MODEL_KEY_ENV_PREFIX
        if not name.startswith(prefix) or name == prefix:
            raise ValidationError(f"key_ref: an env: reference must name a variable starting with {prefix} "
                                  "(other variables of the server are not keys)", field="key_ref")
        return scheme, name
    if scheme == "file" and _FILE_NAME.fullmatch(name):
        _secret_file(name)
        return scheme, name
    if scheme == "file":
        raise ValidationError("key_ref: a file: reference is a plain file name inside TROVE_MODEL_SECRETS_DIR "
                              "(no directories, no '..')", field="key_ref")
    raise ValidationError(KEY_REF_SHAPE, field="key_ref")


def key_resolve(reference: str) -> str:
    """The key a reference points at ('' for no reference), after checking it against the allow-list again.
    Raises ValidationError (not allowed) or KeyUnavailable (allowed, but not readable now). Never store it."""
    if not reference:
        return ""
    scheme, name = key_reference_check(reference)
    if scheme == "env":
        key = env_str(name)
        if not key:
            raise KeyUnavailable(f"key_ref: the variable {name} is not set", field="key_ref")
        return key.strip()
    path = _secret_file(name)
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError as exc:
        raise KeyUnavailable(f"key_ref: cannot read {name} in TROVE_MODEL_SECRETS_DIR ({exc.strerror})",
                             field="key_ref") from None


def _secret_file(name: str) -> str:
    directory = settings.TROVE_MODEL_SECRETS_DIR
    if not directory:
        raise ValidationError("key_ref: file: references need TROVE_MODEL_SECRETS_DIR to be set", field="key_ref")
    root = os.path.realpath(directory)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.dirname(path) != root:  # a symlink planted in the directory that points elsewhere
        raise ValidationError(f"key_ref: {name} leads out of TROVE_MODEL_SECRETS_DIR", field="key_ref")
    return path


# --- registration --------------------------------------------------------------------------------------

def endpoint_fields_clean(*, name: str, base_url: str, protocol: str, model_names: Iterable[str],
                          key_ref: str = "", allow_private_network: bool = False, token_capture: str = "off",
                          policy_version_from: str = "", resolve: Resolver = socket.getaddrinfo) -> dict[str, Any]:
    """The endpoint's fields, checked and normalised; ValidationError naming the first bad one."""
    if not _NAME.fullmatch(name or ""):
        raise ValidationError("name: lower-case letters, digits, '-' and '_', at most 100", field="name")
    if protocol not in ModelEndpoint.Protocol.values:
        raise ValidationError(f"protocol: one of {', '.join(ModelEndpoint.Protocol.values)}", field="protocol")
    url = base_url_check(base_url)
    if not allow_private_network:
        host_addresses_check(url, resolve=resolve)
    if key_ref:
        key_reference_check(key_ref)
    return {"name": name, "base_url": url, "protocol": protocol, "model_names": _model_names(model_names),
            "key_ref": key_ref, "allow_private_network": allow_private_network,
            "token_capture": token_capture_check(token_capture, protocol=protocol),
            "policy_version_from": policy_version_source_check(policy_version_from)}


def token_capture_check(token_capture: str, *, protocol: str) -> str:
    """A capture mode the endpoint's protocol can carry: vLLM's and SGLang's fields are Chat Completions'."""
    mode = (token_capture or ModelEndpoint.TokenCapture.OFF).strip()
    if mode not in ModelEndpoint.TokenCapture.values:
        raise ValidationError(f"token_capture: one of {', '.join(ModelEndpoint.TokenCapture.values)}",
                              field="token_capture")
    if mode != ModelEndpoint.TokenCapture.OFF and protocol != ModelEndpoint.Protocol.CHAT:
        raise ValidationError(f"token_capture: {mode} asks a Chat Completions server for token ids; this endpoint "
                              f"speaks {protocol}", field="token_capture")
    return mode


def policy_version_source_check(source: str) -> str:
    """`header:NAME` (a response header) or `body:a.b.c` (a field of the answer's JSON), or ''."""
    source = (source or "").strip()
    if not source:
        return ""
    kind, _, name = source.partition(":")
    if (kind == "header" and _HEADER_NAME.fullmatch(name)) or (kind == "body" and _BODY_PATH.fullmatch(name)):
        return source
    raise ValidationError("policy_version_from: header:NAME (a response header) or body:field.path (at most 5 "
                          "names of letters, digits and '_'), e.g. body:metadata.weight_version",
                          field="policy_version_from")


def base_url_check(base_url: str) -> str:
    """An http(s) URL with a host and nothing that could carry a secret or change per call."""
    parts = urlsplit((base_url or "").strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("base_url: must be an http(s) URL with a host", field="base_url")
    if parts.username is not None or parts.password is not None:
        raise ValidationError("base_url: no credentials in the URL; put the key behind key_ref", field="base_url")
    if parts.query or parts.fragment:
        raise ValidationError("base_url: no query or fragment", field="base_url")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise ValidationError("base_url: the port is not a number in 1-65535", field="base_url") from None
    return parts.geturl().rstrip("/")


def host_addresses_check(base_url: str, *, resolve: Resolver = socket.getaddrinfo) -> None:
    """Refuse a URL whose host is, or resolves now to, a non-public address. A name that does not resolve
    passes: it may be registered before its DNS exists, and the proxy checks every connection anyway."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            found = resolve(host, parts.port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        addresses = sorted({str(info[4][0]) for info in found})
    for address in addresses:
        reason = address_refusal(address)
        if reason is not None:
            shown = host if host == address else f"{host} resolves to {address}, which"
            raise ValidationError(f"base_url: {shown} is a {reason} address; register a server on a private "
                                  "network with allow_private_network", field="base_url")


def _model_names(model_names: Iterable[str]) -> list[str]:
    names = [str(name).strip() for name in (model_names or [])]
    if not names or any(not name or len(name) > 200 for name in names):
        raise ValidationError("model_names: at least one model name, each 1-200 characters", field="model_names")
    return list(dict.fromkeys(names))


def endpoint_register(*, created_by=None, description: str = "", resolve: Resolver = socket.getaddrinfo,
                      **fields: Any) -> ModelEndpoint:
    """Register an endpoint (admins and ops only: the callers check). Conflict when the name is taken;
    Forbidden when someone other than an admin asks for private networks (`created_by` None is the server's
    own shell)."""
    if fields.get("allow_private_network") and not may_allow_private_network(created_by):
        raise Forbidden(PRIVATE_NETWORK_ADMINS_ONLY, field="allow_private_network")
    cleaned = endpoint_fields_clean(resolve=resolve, **fields)
    try:
        with transaction.atomic():
            return ModelEndpoint.objects.create(**cleaned, description=description, created_by=created_by)
    except IntegrityError:
        raise Conflict(f"name: an endpoint named {cleaned['name']!r} exists already", field="name") from None


PRIVATE_NETWORK_ADMINS_ONLY = (
    "allow_private_network: only an admin may let an endpoint reach loopback, link-local or private addresses "
    "(ask one to register it, in the admin or with manage.py endpoint add --allow-private-network)")


def may_allow_private_network(user) -> bool:
    """Whether `user` may let an endpoint reach non-public addresses: an admin, or nobody (the server's own
    shell: management commands and the demo register with no user)."""
    return user is None or bool(getattr(user, "is_superuser", False))


# --- naming one ----------------------------------------------------------------------------------------

def endpoint_list() -> QuerySet[ModelEndpoint]:
    return ModelEndpoint.objects.order_by("name")


def endpoint_get_by_name(*, name: str, field: str = "endpoint") -> ModelEndpoint:
    endpoint = ModelEndpoint.objects.filter(name=name).first()
    if endpoint is None:
        raise NotFound(f"{field}: no model endpoint named {name!r} (GET /api/v1/endpoints/ lists them)", field=field)
    return endpoint


def endpoint_model(endpoint: ModelEndpoint, model_name: str | None) -> str:
    """The model a job asks for at `endpoint`: one it serves, or its first when none is named."""
    if not model_name:
        return endpoint.model_names[0]
    if model_name not in endpoint.model_names:
        raise ValidationError(f"model_name: endpoint {endpoint.name!r} serves {', '.join(endpoint.model_names)}",
                              field="model_name")
    return model_name
