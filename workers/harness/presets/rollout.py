"""A preset in a rollout: the runner's side (workers/rollout_runner.py calls these around the external
harness). Kept here so the runner only says when; what a preset needs is said in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from experience.records import StepRecord
from experience.services.blobs import blob_put_many
from workers.harness.external import ExternalOutcome, HarnessSetup
from workers.harness.presets import resolve
from workers.harness.presets.base import HarnessRun, Preset
from workers.harness.presets.bundles import bundle_installed
from workers.harness.presets.launch import (
    NATIVE_LOG_BYTES,
    Launch,
    collect_script,
    collected_from,
    launch,
    read_collected,
    verdict,
)
from workers.sandboxes.base import ExecResult, SandboxError


@dataclass(frozen=True)
class PresetFacts:
    """What every trajectory of a preset's rollout records about its harness."""

    name: str
    version: str
    protocol: str

    def as_metadata(self) -> dict[str, str]:
        return {"harness_name": self.name, "harness_version": self.version, "harness_protocol": self.protocol}


def preset_of(harness: str) -> tuple[Preset, str] | None:
    """(preset, version) of a job's harness, None for builtin / external; a bad name is a permanent error."""
    try:
        return resolve(harness)
    except ValueError as error:
        raise SandboxError(str(error), reason="bad_harness", permanent=True) from error


def harness_facts(harness: str) -> dict[str, str]:
    """The harness's name, version and protocol for the trajectory's metadata."""
    resolved = resolve(harness)
    if resolved is None:  # Trove's built-in loop speaks chat; a custom command says nothing Trove can check
        return {"harness_name": harness, "harness_version": "", "harness_protocol": "chat" if harness == "builtin" else ""}
    return PresetFacts(resolved[0].name, resolved[1], resolved[0].protocol).as_metadata()


def check_installed(preset: Preset, version: str, bundle_root: str) -> None:
    """A local sandbox sees only installed bundles: refuse before a sandbox is taken, saying how to fix it."""
    if not bundle_installed(bundle_root, preset, version):
        raise SandboxError(
            f"harness {preset.name}@{version} is not installed under {bundle_root}: run "
            f"`manage.py harness install {preset.name}@{version}`", reason="harness_not_installed", permanent=True)


def prepare(preset: Preset, version: str, setup: HarnessSetup) -> Launch:
    return launch(preset, version, setup)


def harness_exec_output_bytes(harness_output_bytes: int) -> int:
    """The harness exec's output cap: room for the native logs its script prints after the harness."""
    return harness_output_bytes + NATIVE_LOG_BYTES


def split_harness_output(outcome: ExternalOutcome, harness_output_bytes: int
                         ) -> tuple[ExternalOutcome, dict[str, bytes] | None]:
    """The outcome as the harness's own (its stdout without the native logs printed after it, both streams
    cut to `harness_output_bytes`, the exec having had the room of harness_exec_output_bytes), and the
    native logs: None when they are not there whole, for collect_native_logs to read."""
    stdout, files = collected_from(outcome.result.stdout)
    stdout, cut_out = _capped(stdout, harness_output_bytes)
    stderr, cut_err = _capped(outcome.result.stderr, harness_output_bytes)
    result = replace(outcome.result, stdout=stdout, stderr=stderr,
                     truncated_bytes=outcome.result.truncated_bytes + cut_out + cut_err)
    return replace(outcome, result=result), files


def _capped(text: str, limit: int) -> tuple[str, int]:
    # As the agent caps a stream: bytes, then decoded (a character cut in two reads as a replacement).
    data = text.encode()
    if len(data) <= limit:
        return text, 0
    return data[:limit].decode("utf-8", "replace"), len(data) - limit


def collect_native_logs(preset: Preset, execute: Callable[[str, int], ExecResult]) -> dict[str, bytes]:
    """The harness's own logs, read from the sandbox after it ended (`execute(script, max_output)`).
    A log that cannot be read is no reason to fail the rollout: {} then, and the step says so."""
    try:
        result = execute(collect_script(preset), NATIVE_LOG_BYTES)
        if result.exit_code != 0 or result.truncated_bytes:
            return {}
        return read_collected(result.stdout)
    except (SandboxError, ValueError, OSError, EOFError):
        return {}


def native_log_step(run: Launch, files: dict[str, bytes]) -> StepRecord:
    """A note holding the native logs by blob hash, beside the proxy's records of the same run."""
    digests = blob_put_many(files[path] for path in sorted(files)) if files else []
    entries = [{"path": path, "sha256": digest, "bytes": len(files[path])}
               for path, digest in zip(sorted(files), digests, strict=True)]
    text = (f"native log of {run.preset.name}@{run.version}: {len(entries)} file(s)" if entries
            else f"{run.preset.name}@{run.version} left no native log")
    return StepRecord(kind="note", started_at=datetime.now(UTC), text=text,
                      payload={"native_logs": entries, "harness": run.preset.name, "harness_version": run.version})


def failure(run: Launch, result: ExecResult, files: dict[str, bytes], model_calls: int) -> str | None:
    return verdict(run.preset, HarnessRun(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr,
                                          native_logs=files, model_calls=model_calls),
                   timed_out=result.timed_out)
