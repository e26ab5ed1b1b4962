"""Task sets, rollout jobs and rollouts. A Rollout is one sample of one task; its Trajectory is the record."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


class TaskSet(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=32, default="demo", help_text="demo | jsonl | api")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


def default_protected_paths() -> list[str]:
    return ["tests/"]


class Task(models.Model):
    task_set = models.ForeignKey(TaskSet, on_delete=models.CASCADE, related_name="tasks")
    key = models.CharField(max_length=200)
    title = models.CharField(max_length=300, blank=True)
    instruction = models.TextField()
    difficulty = models.CharField(max_length=16, blank=True)
    files = models.JSONField(default=dict, blank=True, help_text="relative path -> text, written to the workspace")
    setup_commands = models.JSONField(default=list, blank=True)
    eval_command = models.TextField()
    eval_timeout_s = models.PositiveIntegerField(default=60)
    # The evaluation passes when eval_command exits with this code (SWE-bench style tasks use 0).
    success_exit_code = models.IntegerField(default=0)
    # Reward integrity (workers/eval_integrity.py): before the evaluation, each protected path (a directory
    # ends in "/") is removed from the workspace and its files are written again from `files`; `eval_files`
    # (hidden evaluation tests) reach the sandbox only then, so the agent never sees or runs them.
    protected_paths = models.JSONField(default=default_protected_paths, blank=True,
                                       help_text="workspace paths restored from the task before the evaluation")
    eval_files = models.JSONField(default=dict, blank=True,
                                  help_text="relative path -> text, written only for the evaluation (hidden tests)")
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task_set", "key"], name="task_unique_key")]
        ordering = ["task_set_id", "key"]

    def __str__(self) -> str:
        return self.key


class ModelEndpoint(models.Model):
    """A model server an admin (or ops) registered: the only places a job's model calls may go.

    The key is never stored: `key_ref` points at it, from an allow-list (webapp/rollouts/endpoints.py).
    """

    class Protocol(models.TextChoices):
        CHAT = "chat", "OpenAI Chat Completions"
        RESPONSES = "responses", "OpenAI Responses"
        MESSAGES = "messages", "Anthropic Messages"
        GEMINI = "gemini", "Gemini API"

    class TokenCapture(models.TextChoices):
        OFF = "off", "off"
        VLLM = "vllm", "vLLM (return_token_ids, logprobs)"
        SGLANG = "sglang", "SGLang (return_prompt_token_ids, return_token_ids, logprobs)"

    name = models.SlugField(max_length=100, unique=True)
    base_url = models.CharField(max_length=500, help_text="e.g. http://vllm.internal:8000/v1 (with /v1 for chat)")
    protocol = models.CharField(max_length=16, choices=Protocol.choices, default=Protocol.CHAT)
    model_names = models.JSONField(default=list, help_text="the models a job may name here; the first is the default")
    key_ref = models.CharField(max_length=200, blank=True,
                               help_text="env:TROVE_MODEL_KEY_... or file:NAME in the secrets directory; never the key")
    # Loopback, link-local and private addresses are refused unless this is set (a server on the same host or
    # network: the demo model, a lab's vLLM). A trainer can never set it: only admins and ops register.
    allow_private_network = models.BooleanField(default=False)
    # Token-level data for RL samples (webapp/proxy/capture.py): the proxy asks the server for prompt and
    # completion token ids and logprobs in the fields its kind of server reads, and strips them from what the
    # harness gets unless it asked itself.
    token_capture = models.CharField(max_length=16, choices=TokenCapture.choices, default=TokenCapture.OFF)
    # Where the server says which weights served a call: `header:NAME` or `body:dotted.path`; blank = nowhere.
    policy_version_from = models.CharField(max_length=200, blank=True,
                                           help_text="header:X-Weights-Version or body:metadata.weight_version")
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RolloutJob(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"

    class Sampling(models.TextChoices):
        UNIFORM = "uniform"
        ADAPTIVE = "adaptive"

    name = models.CharField(max_length=200, blank=True)
    task_set = models.ForeignKey(TaskSet, on_delete=models.PROTECT, related_name="jobs")
    fleet = models.ForeignKey("fleets.Fleet", on_delete=models.PROTECT, related_name="jobs")
    harness = models.CharField(max_length=100, default="builtin")
    harness_command = models.TextField(blank=True, help_text="external harness: command run in the sandbox")
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="jobs")
    model_name = models.CharField(max_length=200, help_text="one of the endpoint's model_names")
    samples_per_task = models.PositiveIntegerField(default=1)
    max_steps = models.PositiveIntegerField(default=30)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    wall_time_s = models.PositiveIntegerField(default=600)
    concurrency = models.PositiveIntegerField(default=4)
    sampling = models.CharField(max_length=16, choices=Sampling.choices, default=Sampling.UNIFORM)
    adaptive_first_round = models.PositiveIntegerField(default=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.name or f"job {self.pk}"


def rollout_token_hash(token: str) -> str:
    """What is stored of a proxy token. A plain SHA-256 is enough: tokens are 192 random bits, not guessable."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_rollout_token() -> tuple[str, str]:
    """A fresh proxy token and its hash: the plaintext goes to the harness only, the hash to the database."""
    token = secrets.token_urlsafe(24)
    return token, rollout_token_hash(token)


def _new_token() -> str:
    # A queued rollout's placeholder: the hash of a token nobody was given, so it unlocks nothing.
    return new_rollout_token()[1]


class Rollout(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"  # the task's evaluation passed
        FAILED = "failed"  # the agent ran to the end and the evaluation did not pass
        INFRA_ERROR = "infra_error"  # Trove or the sandbox failed: never training data
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.INFRA_ERROR, Status.CANCELLED)

    job = models.ForeignKey(RolloutJob, on_delete=models.CASCADE, related_name="rollouts")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="rollouts")
    sample_index = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    # The SHA-256 of the attempt's proxy token (the plaintext is handed to the harness and kept nowhere).
    token = models.CharField(max_length=64, unique=True, default=_new_token)
    attempt = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When its Celery message was last sent (a first send, a requeue, or a re-send of a message the broker
    # lost: rollouts_resend_due, at most once per interval). NULL while it waits for a slot of its job's
    # concurrency, with no message out: the finish that frees a slot sends it (services._dispatch_locked).
    sent_at = models.DateTimeField(null=True, blank=True)
    sandbox = models.ForeignKey("fleets.Sandbox", null=True, blank=True, on_delete=models.SET_NULL)
    trajectory = models.OneToOneField(
        "experience.Trajectory", null=True, blank=True, on_delete=models.SET_NULL, related_name="rollout"
    )
    reward = models.FloatField(null=True, blank=True)
    steps = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    eval_output = models.TextField(blank=True)
    eval_timed_out = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    timings = models.JSONField(default=dict, blank=True, help_text="ms spent in model, sandbox, eval, total")
    # Position in the job's finish order, handed out under the job's row lock, so it follows commit order:
    # a trainer paging with `after=<finish_seq>` never skips a rollout that committed late.
    finish_seq = models.PositiveIntegerField(null=True, blank=True, editable=False)
    rerun_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "task", "sample_index"], name="rollout_unique_sample"),
            models.UniqueConstraint(fields=["job", "finish_seq"], name="rollout_unique_finish_seq"),
        ]
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "status"])]

    def __str__(self) -> str:
        return f"rollout {self.pk} ({self.task_id}#{self.sample_index})"
