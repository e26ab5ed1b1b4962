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
    # dedup: duplicates are marked with their cluster and canonical run, never deleted
    content_hash = models.CharField(max_length=64, blank=True, db_index=True, help_text="exact-dedup hash")
    cluster = models.ForeignKey("DedupCluster", null=True, blank=True, on_delete=models.SET_NULL, related_name="members")
    canonical = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="duplicates")
    is_duplicate = models.BooleanField(default=False, db_index=True)
    similarity = models.FloatField(null=True, blank=True, help_text="cosine similarity to the canonical run")
    # curation
    curation_status = models.CharField(
        max_length=16, choices=Curation.choices, default=Curation.PENDING, db_index=True
    )
    tags = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    # search: whether every step has its StepSearch document (filled off the ingest path, see StepSearch)
    search_indexed = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "trajectories"
        constraints = [
            models.UniqueConstraint(fields=["source", "source_ref"], name="trajectory_unique_source_ref"),
        ]
        # One index per list filter of the explorer and the admin, so a filtered page on a large table is an
        # index scan. Postgres-only indexes (the tags GIN, step full-text GIN) live in migration 0002.
        indexes = [
            models.Index(fields=["task_key", "status"]),
            models.Index(fields=["source", "source_format"], name="trajectory_source_idx"),
            models.Index(fields=["harness"], name="trajectory_harness_idx"),
            models.Index(fields=["source_format"], name="trajectory_format_idx"),
            # "was this file imported before?" is a lookup by the file's hash
            models.Index(fields=["original_blob"], name="trajectory_original_idx"),
            # the search indexer's queue: small, since runs leave it within seconds of arriving
            models.Index(fields=["id"], condition=models.Q(search_indexed=False), name="trajectory_unindexed_idx"),
        ]

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

    # No index of its own: the unique (trajectory, seq) index serves every lookup by trajectory, and one index
    # fewer to maintain is a faster bulk ingest.
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps", db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(null=True, blank=True)
    tokens_out = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    is_error = models.BooleanField(default=False)
    # NULL, not "": steps without a call id must not collide in the conditional unique constraint below.
    call_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
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


class TsVectorField(models.Field):
    """A Postgres tsvector (text elsewhere, where it stays unused: SQLite searches by substring)."""

    def db_type(self, connection) -> str:
        return "tsvector" if connection.vendor == "postgresql" else "text"


class StepSearch(models.Model):
    """A step's full-text search document (Postgres), answered by a GIN index (migration 0002).

    Kept out of the ingest path: computing a tsvector costs Postgres more than storing the step, so
    experience.services.search_index fills these rows in batches after runs arrive (and search also scans
    the steps of runs not yet indexed, so results never lag). `step_id` is not a foreign key: steps are only
    ever deleted with their trajectory, and this row goes with the trajectory too.
    """

    step_id = models.BigIntegerField(primary_key=True)
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="+")
    document = TsVectorField()

    def __str__(self) -> str:
        return f"search document of step {self.step_id}"


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
        indexes = [models.Index(fields=["action"], name="curationevent_action_idx")]  # the admin's list filter

    def __str__(self) -> str:
        return f"{self.action} on trajectory {self.trajectory_id}"


class DedupCluster(models.Model):
    """A group of runs that are exact or near duplicates of each other; one of them is canonical."""

    class Method(models.TextChoices):
        EXACT = "exact"
        NEAR = "near"
        MANUAL = "manual"

    task_key = models.CharField(max_length=300, db_index=True)
    method = models.CharField(max_length=8, choices=Method.choices)
    canonical = models.ForeignKey(Trajectory, null=True, on_delete=models.SET_NULL, related_name="+")
    size = models.PositiveIntegerField(default=0)
    # Its runs' outcomes differ: grouped for browsing, but each outcome keeps a run for training
    # (experience.dedup.canonical).
    mixed_outcomes = models.BooleanField(default=False)
    canonical_rule = models.PositiveSmallIntegerField(
        default=0, help_text="the canonical rule version its canonical and marks were derived with (0: none)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"cluster {self.pk} ({self.method}, {self.size} runs)"


class TrajectoryEmbedding(models.Model):
    """The dedup signature's embedding, stored in the database; the FAISS index is a rebuildable cache of
    these rows (ids above its high-water mark are added incrementally)."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="embeddings")
    embedder = models.CharField(max_length=64)
    dim = models.PositiveIntegerField()
    vector = models.BinaryField(help_text="float32, L2-normalised")
    signature_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "embedder"], name="embedding_unique_per_embedder"),
        ]

    def __str__(self) -> str:
        return f"{self.embedder} embedding of trajectory {self.trajectory_id}"


class TrajectoryDigest(models.Model):
    """A run's decisions as a value set reads them (`experience.distill.digest`), derived from its steps by
    the first build that reads the run (or `manage.py digest_runs`), so later builds need not read the
    steps again. Valid while `version` is the code's DIGEST_VERSION and `instruction_sha256` matches the
    run's instruction; on Postgres a trigger deletes it when any of the run's steps is inserted, changed
    (other than its value estimate) or deleted (migration 0007)."""

    trajectory = models.OneToOneField(
        Trajectory, on_delete=models.CASCADE, primary_key=True, related_name="digest"
    )
    version = models.CharField(max_length=64)
    instruction_sha256 = models.CharField(max_length=64)
    steps_sha256 = models.CharField(max_length=64, help_text="what the run's content hash reads of its steps")
    n_steps = models.PositiveIntegerField()
    labels = models.JSONField(default=list, help_text="the rubric's label changes: [name, value, step id]")
    data = models.BinaryField(help_text="zstd-compressed JSON (experience.distill.digest.RunDigest.encode)")
    error = models.TextField(blank=True, help_text="why deriving it failed (then `data` is empty and unread)")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"digest of trajectory {self.trajectory_id} ({self.version})"


class Label(models.Model):
    """A label on a run or one of its steps: process-rubric detectors, curators, value models."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="labels")
    # Not a database constraint: checking it locks each referenced step row (FOR KEY SHARE), which dirtied
    # the steps' pages and cost Postgres ~10 s per 1M steps' worth of rubric labels; deleting a step still
    # deletes its labels (the ORM cascades), and labels are only written for steps just read.
    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.CASCADE, related_name="labels", db_constraint=False
    )
    name = models.CharField(max_length=100)
    value = models.JSONField()
    source = models.CharField(max_length=32, default="rubric", help_text="rubric | human | model")
    version = models.CharField(max_length=32, default="1")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["trajectory", "name"])]
        constraints = [
            # A run's rubric is written once per rubric version, however many builders and beat ticks
            # read the run at the same time (`datasets.rubric_labels_write` skips conflicts).
            models.UniqueConstraint(
                fields=["trajectory", "source", "version", "name"],
                condition=models.Q(source="rubric"),
                name="label_rubric_once_per_version",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class Dataset(models.Model):
    """A spec (filters, kind, options); each build is an immutable DatasetVersion."""

    class Kind(models.TextChoices):
        VALUE = "value"
        OUTCOME = "outcome"
        PAIRWISE = "pairwise"
        SFT = "sft"

    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    filters = models.JSONField(default=dict, blank=True)
    options = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    class Status(models.TextChoices):
        BUILDING = "building"
        READY = "ready"
        FAILED = "failed"

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.BUILDING)
    spec = models.JSONField(default=dict, help_text="the dataset spec frozen at build time")
    manifest = models.JSONField(default=dict, blank=True)
    content_hash = models.CharField(max_length=64, blank=True)
    row_count = models.PositiveBigIntegerField(default=0)
    files = models.JSONField(default=dict, blank=True, help_text="format -> path under TROVE_DATASET_DIR")
    error = models.TextField(blank=True)
    metrics = models.JSONField(default=dict, blank=True, help_text="baseline value model results")
    forced_warnings = models.JSONField(
        default=list, blank=True, help_text="what the build request was warned of and forced past (an empty split)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "version"], name="dataset_version_unique")]
        ordering = ["dataset_id", "-version"]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.version}"

from experience.review_models import (  # noqa: E402, F401 (review models)
    PairwisePreference,
    ReviewItem,
    ReviewQueue,
    SavedFilter,
)
