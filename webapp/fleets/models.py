"""Environment fleets: templates (immutable), fleets (warm-pool targets), sandboxes and their event log.

Transitions live in `webapp.fleets.services` (conditional UPDATEs); orchestration with a backend lives in
`workers.fleet_ops` and `workers.reconciler`. Nothing here calls a backend.
"""

from __future__ import annotations

import hashlib
import json

from django.db import models

from experience.errors import Conflict


class EnvironmentTemplate(models.Model):
    """Immutable: a change makes a new version (`services.template_revise`). `spec_hash` identifies the
    effective sandbox spec, so two versions with the same hash make interchangeable sandboxes."""

    class Network(models.TextChoices):
        NONE = "none"
        PROXY_ONLY = "proxy-only"
        ALLOW_LIST = "allow-list"

    class EvalMode(models.TextChoices):
        """Where a rollout's evaluation runs. `in-place`: in the rollout's own sandbox, after every process
        the policy left is killed and the task's protected files are restored. `fresh-sandbox`: in a new
        sandbox of the same fleet, set up from the task and the final workspace diff (protected paths left
        out), so nothing the policy did outside its diff can reach the evaluation."""

        IN_PLACE = "in-place"
        FRESH_SANDBOX = "fresh-sandbox"

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    image = models.CharField(max_length=300, blank=True, help_text="Kubernetes image, pinned by digest")
    rootfs = models.CharField(max_length=300, blank=True, help_text="local: root filesystem; empty = host /usr")
    cpu = models.FloatField(default=1.0)
    memory_mb = models.PositiveIntegerField(default=1024)
    pids = models.PositiveIntegerField(default=256)
    disk_mb = models.PositiveIntegerField(default=1024)
    network = models.CharField(max_length=16, choices=Network.choices, default=Network.PROXY_ONLY)
    allow_list = models.JSONField(default=list, blank=True)
    setup_commands = models.JSONField(default=list, blank=True)
    max_lifetime_s = models.PositiveIntegerField(default=3600)
    idle_timeout_s = models.PositiveIntegerField(default=900)
    reusable = models.BooleanField(default=False, help_text="sandboxes are single-use unless this is set")
    eval_mode = models.CharField(max_length=16, choices=EvalMode.choices, default=EvalMode.IN_PLACE,
                                 help_text="where rollouts are evaluated: in their own sandbox or a fresh one")
    spec_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    SPEC_FIELDS = (
        "image", "rootfs", "cpu", "memory_mb", "pids", "disk_mb", "network", "allow_list",
        "setup_commands", "max_lifetime_s", "idle_timeout_s", "reusable", "eval_mode",
    )
    # Left out of the hash at their default, so versions made before the field existed keep their hash.
    HASH_DEFAULTS = {"eval_mode": EvalMode.IN_PLACE}

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="template_unique_version")]
        ordering = ["name", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def save(self, *args, **kwargs):
        # A fleet's sandboxes were built from this row: changing it in place would make `spec_hash` lie about
        # them. Edits go through services.template_revise, which writes a new version.
        if not self._state.adding:
            raise Conflict(f"template {self}: templates are immutable; create a new version", field="template")
        self.spec_hash = self.compute_spec_hash()
        super().save(*args, **kwargs)

    def compute_spec_hash(self) -> str:
        spec = {field: getattr(self, field) for field in self.SPEC_FIELDS
                if field not in self.HASH_DEFAULTS or getattr(self, field) != self.HASH_DEFAULTS[field]}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


class Fleet(models.Model):
    class Backend(models.TextChoices):
        LOCAL = "local"
        KUBERNETES = "kubernetes"

    class Sizing(models.TextChoices):
        FIXED = "fixed"
        BACKLOG = "backlog"

    class MissPolicy(models.TextChoices):
        WAIT = "wait"
        COLD = "cold"

    class Status(models.TextChoices):
        ACTIVE = "active"
        DRAINING = "draining"
        HOLDING = "holding"

    class HoldKind(models.TextChoices):
        """Why the reconciler stopped creating. `permanent` waits for an operator (a new template version,
        or a scale); the others retry on their own after a back-off."""

        NONE = ""
        PERMANENT = "permanent", "permanent error (bad image or spec)"
        CAPACITY = "capacity", "no capacity on the backend"
        QUOTA = "quota", "quota exceeded"
        MAX_TOTAL = "max_total", "at max_total"
        FAILURES = "failures", "creates keep failing"
        BACKEND = "backend", "backend unavailable"

    name = models.CharField(max_length=100, unique=True)
    template = models.ForeignKey(EnvironmentTemplate, on_delete=models.PROTECT, related_name="fleets")
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.LOCAL)
    min_warm = models.PositiveIntegerField(default=0)
    max_warm = models.PositiveIntegerField(default=4)
    max_total = models.PositiveIntegerField(default=16)
    refill_per_minute = models.PositiveIntegerField(default=120)
    sizing = models.CharField(max_length=16, choices=Sizing.choices, default=Sizing.BACKLOG)
    miss_policy = models.CharField(max_length=8, choices=MissPolicy.choices, default=MissPolicy.COLD)
    miss_wait_ms = models.PositiveIntegerField(default=2000, help_text="how long a miss waits for a refill (wait policy)")
    provision_timeout_s = models.PositiveIntegerField(default=120, help_text="a sandbox not ready by then has failed")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    hold_kind = models.CharField(max_length=16, choices=HoldKind.choices, default=HoldKind.NONE, blank=True)
    hold_reason = models.TextField(blank=True)
    held_at = models.DateTimeField(null=True, blank=True)
    hold_until = models.DateTimeField(null=True, blank=True, help_text="next retry of a transient hold")
    # Backend objects carrying this fleet's label but no row, by name -> first seen (ISO time): deleted once
    # they have been seen for the orphan grace period (see workers/reconciler.py).
    orphans_seen = models.JSONField(default=dict, blank=True)
    claims_hit = models.PositiveBigIntegerField(default=0)
    claims_miss = models.PositiveBigIntegerField(default=0)
    reconciled_at = models.DateTimeField(null=True, blank=True)
    last_report = models.JSONField(default=dict, blank=True, help_text="what the last reconcile round did")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name

    @property
    def hit_rate(self) -> float | None:
        total = self.claims_hit + self.claims_miss
        return self.claims_hit / total if total else None


class Sandbox(models.Model):
    class State(models.TextChoices):
        REQUESTED = "requested"
        PROVISIONING = "provisioning"
        WARM = "warm"
        LEASED = "leased"
        RELEASED = "released"
        TERMINATING = "terminating"
        TERMINATED = "terminated"
        FAILED = "failed"
        LOST = "lost"

    LIVE_STATES = (State.REQUESTED, State.PROVISIONING, State.WARM, State.LEASED, State.RELEASED)
    OCCUPYING_STATES = LIVE_STATES + (State.TERMINATING,)

    fleet = models.ForeignKey(Fleet, on_delete=models.PROTECT, related_name="sandboxes")
    template = models.ForeignKey(EnvironmentTemplate, on_delete=models.PROTECT, null=True, blank=True,
                                 related_name="+", help_text="the version this sandbox was built from")
    spec_hash = models.CharField(max_length=64, blank=True)
    name = models.CharField(max_length=63, unique=True, help_text="deterministic backend name")
    state = models.CharField(max_length=16, choices=State.choices, default=State.REQUESTED, db_index=True)
    endpoint = models.CharField(max_length=300, blank=True)
    # The per-sandbox agent secret: generated by the backend, never shown on a page or in the API.
    agent_secret = models.CharField(max_length=128, blank=True)
    failure_reason = models.TextField(blank=True)
    backend_reason = models.TextField(blank=True, help_text="the backend's last word on a sandbox not yet ready")
    # Set when the creating process waits for readiness itself (a cold claim, a local create): observers
    # leave the row to it until its provision timeout has passed.
    creator_waits = models.BooleanField(default=False)
    lease_holder = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.PositiveBigIntegerField(default=0)
    cold_claim = models.BooleanField(default=False)
    requested_at = models.DateTimeField(auto_now_add=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    leased_at = models.DateTimeField(null=True, blank=True)
    first_exec_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    terminated_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["fleet", "state"])]
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.name


class SandboxEvent(models.Model):
    """Append-only: every state transition and every exec, with the reason; also fleet-level events
    (holds, orphans deleted) where `sandbox` is empty and `sandbox_name` names the backend object."""

    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="events", null=True, blank=True)
    sandbox_name = models.CharField(max_length=63, blank=True)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The fleet page pages its log newest first, and reads recent leases for the claim histogram.
            models.Index(fields=["fleet", "-id"], name="fleets_event_fleet_id"),
            models.Index(fields=["fleet", "to_state", "-id"], name="fleets_event_fleet_to_id"),
        ]

    def __str__(self) -> str:
        return f"{self.sandbox_name or self.fleet_id}: {self.kind} {self.to_state}".strip()

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise Conflict("sandbox events are append-only", field="event")
        super().save(*args, **kwargs)
