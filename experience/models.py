"""The trajectory store: runs (Trajectory), their ordered steps (Step), and content-addressed text (Blob).

Large text lives in Blob rows keyed by sha256 and stored once. A model call's context is a list of
message hashes in the step's `blob_refs`, so a 50-call run whose context grows does not store it 50 times.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Blob(models.Model):
    """Immutable content, stored once by the sha256 of its raw bytes. Compressed when that pays."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    size = models.PositiveBigIntegerField(help_text="length of the raw content in bytes")
    encoding = models.CharField(max_length=8, default="raw", help_text="raw | zstd")
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} B)"


class Trajectory(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        INFRA_ERROR = "infra_error"
        CANCELLED = "cancelled"
        IMPORTED = "imported"

    class Curation(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # provenance
    source = models.CharField(max_length=32, help_text="rollout | import | api")
    source_format = models.CharField(max_length=64, blank=True)
    source_version = models.CharField(max_length=64, blank=True)
    source_ref = models.CharField(max_length=512, help_text="stable identity within the source")
    task_set = models.CharField(max_length=200, blank=True)
    task_key = models.CharField(max_length=300, db_index=True)
    instruction = models.TextField(blank=True)
    harness = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True, db_index=True)
    template = models.CharField(max_length=200, blank=True)
    image_digest = models.CharField(max_length=200, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    original_blob = models.CharField(max_length=64, blank=True, help_text="sha256 of the imported file")
    # outcome
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING, db_index=True)
    reward = models.FloatField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    final_diff = models.TextField(blank=True)
    # counts
    n_steps = models.PositiveIntegerField(default=0)
    n_model_calls = models.PositiveIntegerField(default=0)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost = models.FloatField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    next_seq = models.PositiveIntegerField(default=0, help_text="next step number to hand out")
    # dedup
    content_hash = models.CharField(max_length=64, blank=True, db_index=True)
    # curation
    curation_status = models.CharField(
        max_length=16, choices=Curation.choices, default=Curation.PENDING, db_index=True
    )
    tags = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["source", "source_ref"], name="trajectory_unique_source_ref"),
        ]
        indexes = [models.Index(fields=["task_key", "status"])]

    def __str__(self) -> str:
        return f"trajectory {self.pk} ({self.task_key})"


class Step(models.Model):
    class Kind(models.TextChoices):
        MODEL_CALL = "model_call"
        MESSAGE = "message"
        TOOL_CALL = "tool_call"
        COMMAND = "command"
        OBSERVATION = "observation"
        FILE_CHANGE = "file_change"
        EVAL = "eval"
        SANDBOX_EVENT = "sandbox_event"
        NOTE = "note"

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(null=True, blank=True)
    tokens_out = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    is_error = models.BooleanField(default=False)
    call_id = models.CharField(max_length=100, null=True, blank=True)
    preview = models.TextField(blank=True, help_text="a short text preview (first few hundred chars)")
    payload = models.JSONField(default=dict, blank=True)
    blob_refs = models.JSONField(default=dict, blank=True, help_text="role -> sha256 or [sha256, ...]")
    value_estimate = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["trajectory_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "seq"], name="step_unique_seq"),
            models.UniqueConstraint(
                fields=["trajectory", "call_id"],
                condition=models.Q(call_id__isnull=False),
                name="step_unique_call_id",
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.seq} {self.kind}"


class CurationEvent(models.Model):
    """Append-only record of every curation change: who, when, what, why."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="curation_events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=32)
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
