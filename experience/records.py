"""Plain records that cross the boundary into the experience store.

Importers, the recording proxy, the built-in harness and the REST API all describe a run with these
dataclasses; `experience.services.ingest` is the one place that turns them into rows. Nothing here
touches the database, so importers and algorithms are unit-tested without Django.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

STEP_KINDS = (
    "model_call",  # one call to a model: request messages, response, usage, latency
    "message",  # a chat message that was not a model call (system prompt, user turn, agent thought)
    "tool_call",  # a structured tool invocation emitted by the model
    "command",  # a shell command run in the sandbox, with its output and exit code
    "observation",  # what the environment returned that is not a command result
    "file_change",  # a diff to the workspace
    "eval",  # the task's evaluation (tests) and its verdict
    "sandbox_event",  # lifecycle of the sandbox the run used
    "note",  # anything else worth keeping (errors of the harness, truncation notices)
)

TRAJECTORY_STATUSES = ("running", "completed", "failed", "infra_error", "cancelled", "imported")


@dataclass
class MessageRecord:
    """One OpenAI-style chat message. `content` is text; tool calls keep their original JSON."""

    role: str
    content: str = ""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def as_openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        return message


@dataclass
class StepRecord:
    """One step of a run.

    For a `model_call`, `request_messages` holds the full context the model saw (stored as message blobs,
    each once) and `response_text` the reply. For a `command`, `command`, `output`, `exit_code`.
    `call_id` makes a model call idempotent: ingesting the same call twice keeps one step.
    """

    kind: str
    started_at: datetime | None = None
    ended_at: datetime | None = None
    duration_ms: float | None = None
    text: str = ""  # the main content (message text, thought, observation, eval output)
    command: str | None = None
    output: str | None = None
    exit_code: int | None = None
    request_messages: list[MessageRecord] | None = None
    response_text: str | None = None
    response_json: dict[str, Any] | None = None  # the upstream body, verbatim (minus huge fields)
    tool_calls: list[dict[str, Any]] | None = None
    model: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    call_id: str | None = None
    is_error: bool = False
    payload: dict[str, Any] = field(default_factory=dict)  # anything format-specific worth keeping


@dataclass
class TrajectoryRecord:
    """A whole run, from any source.

    `source` is where it came from (`rollout`, `import`, `api`); `source_format` / `source_version` the
    file format an importer read (`swe-agent-traj`, `openhands-output`, `inspect-eval`, ...);
    `source_ref` a stable identity within that source (file path + index, rollout id) so re-importing
    the same run is a no-op.
    """

    source: str
    source_format: str
    source_ref: str
    task_key: str
    instruction: str = ""
    source_version: str = ""
    task_set: str = ""
    harness: str = ""
    model: str = ""
    status: str = "imported"
    reward: float | None = None
    success: bool | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cost: float | None = None
    final_diff: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
