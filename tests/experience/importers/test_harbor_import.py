"""Harbor trial directories: a real trial (ATIF-v1.6, images, a 0.8333 reward) and built ones to the published
schema (ATIF-v1.7 subagents, llm_call_count, token ids and logprobs; a trial that raised)."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

import pytest

from experience.distill.rl_samples import call_of_payload
from experience.importers import ImportFormatError, ImportValidationError, detect_format, read_all
from importers.fixture_files import (
    ATIF_V17,
    HARBOR_BROKEN,
    HARBOR_BUILT,
    HARBOR_BUILT_JOB,
    HARBOR_REAL,
    HARBOR_REAL_JOB,
    raw_json,
)


def test_a_real_trial_is_one_run_with_the_verifiers_reward_and_the_agents_steps() -> None:
    [run] = read_all(HARBOR_REAL / "result.json")
    result = raw_json(HARBOR_REAL / "result.json")
    assert run.source_format == "harbor-trial" and run.source_version == "ATIF-v1.6"
    assert run.source_ref == "harbor:df3eb90a-3bfe-4f35-bc58-c8b309da0aa7"
    assert (run.task_key, run.harness, run.model) == ("computer-use-oncall-debug", "navigator",
                                                      "gemini/gemini-3-flash-preview")
    assert run.reward == result["verifier_result"]["rewards"]["reward"] == 0.8333
    assert run.success is None, "a reward that is not 0/1 sets no verdict without a threshold"
    assert run.started_at == datetime(2026, 2, 9, 8, 15, 22, 549136, tzinfo=UTC)
    assert run.metadata["harbor"]["job_id"] == "7ffceb05-af37-4a3a-89a6-56dae264539c"
    assert run.metadata["harbor"]["environment"] == "daytona"
    assert run.metadata["usage"] == {"tokens_in": 789477, "tokens_out": 3079, "tokens_cached": None, "api_calls": None}


def test_a_real_trials_messages_calls_and_results_are_the_files_bytes() -> None:
    [run] = read_all(HARBOR_REAL / "result.json")
    steps = raw_json(HARBOR_REAL / "agent" / "trajectory.json")["steps"]
    assert [s.kind for s in run.steps] == ["message", "model_call", "tool_call", "observation",
                                           "model_call", "tool_call", "observation"]
    assert run.steps[0].text == steps[0]["message"] == run.instruction
    shot, scroll = run.steps[2].tool_calls[0], run.steps[5].tool_calls[0]
    assert shot["id"] == steps[1]["tool_calls"][0]["tool_call_id"]
    assert shot["function"] == {"name": "computer_screenshot", "arguments": "{}"}
    assert json.loads(scroll["function"]["arguments"]) == steps[2]["tool_calls"][0]["arguments"]
    assert run.steps[3].text == "[image]", "an image result without a call id is an observation of its own"
    assert run.steps[6].text == steps[2]["observation"]["results"][0]["content"]
    assert [s.tokens_in for s in run.steps if s.kind == "model_call"] == [2632, 3755]


def test_every_file_of_a_trial_is_detected_as_the_trial_and_reads_to_the_same_runs() -> None:
    whole = read_all(HARBOR_BUILT / "result.json")
    for member in ("agent/trajectory.json", "agent/subagent-checker.trajectory.json"):
        assert detect_format(HARBOR_BUILT / member) == "harbor"
        assert [r.source_ref for r in read_all(HARBOR_BUILT / member)] == [r.source_ref for r in whole]


def test_the_jobs_own_result_is_not_a_trial() -> None:
    for job in (HARBOR_REAL_JOB, HARBOR_BUILT_JOB):
        with pytest.raises(ImportFormatError, match="a Harbor job's summary, not a run: its trials are the folders"):
            detect_format(job / "result.json")


def test_v1_7_llm_call_counts_token_ids_and_logprobs() -> None:
    run, *_ = read_all(HARBOR_BUILT / "result.json")
    steps = raw_json(HARBOR_BUILT / "agent" / "trajectory.json")["steps"]
    calls = [s for s in run.steps if s.kind == "model_call"]
    assert len(calls) == 3, "step 4 (llm_call_count 0) made no model call"
    first, delegating, _ = calls
    assert first.payload["prompt_token_ids"] == steps[2]["metrics"]["prompt_token_ids"]
    assert first.payload["token_ids"] == steps[2]["metrics"]["completion_token_ids"]
    assert first.payload["logprobs"] == steps[2]["metrics"]["logprobs"]
    assert "llm_call_count" not in first.payload and delegating.payload["llm_call_count"] == 2
    call = call_of_payload(first.payload, seq=0)  # what RL sample assembly reads of an imported call
    assert call.has_ids and call.completion_ids == [2082, 25, 1598, 2889] and call.logprobs == [-0.0123, -1.5, -0.25, 0.0]
    assert first.text == steps[2]["reasoning_content"] and first.response_text == steps[2]["message"]


def test_terminus_keystrokes_are_commands_with_their_outputs_verbatim() -> None:
    run, *_ = read_all(HARBOR_BUILT / "result.json")
    steps = raw_json(HARBOR_BUILT / "agent" / "trajectory.json")["steps"]
    commands = [s for s in run.steps if s.kind == "command"]
    assert [c.command for c in commands] == ["ls -l /app/run.sh\n", "cat /app/run.sh\n",
                                             "chmod +x /app/run.sh && /app/run.sh\n"]
    assert commands[1].output == steps[2]["observation"]["results"][1]["content"] == '#!/bin/sh\necho "ok ✓"\n\x1b[0m'
    assert commands[2].output == "ok ✓\n"


def test_a_deterministic_dispatch_keeps_its_action_and_the_error_flag() -> None:
    run, *_ = read_all(HARBOR_BUILT / "result.json")
    checker = next(s for s in run.steps if s.payload.get("tool") == "checker")
    index = run.steps.index(checker)
    assert run.steps[index - 1].kind == "command", "no model call opens the dispatched action"
    answer = run.steps[index + 1]
    assert (answer.text, answer.payload["is_error"]) == ("mode 0644: not executable", True)


def test_subagents_embedded_and_by_file_are_runs_linked_to_the_trial() -> None:
    run, embedded, by_file = read_all(HARBOR_BUILT / "result.json")
    trial = "harbor:5a1c9e7d-0f3b-4e2a-8c6d-9b4f2e1a7c30"
    assert (embedded.source_ref, by_file.source_ref) == (f"{trial}/verifier-1",
                                                         f"{trial}/subagent-checker.trajectory.json")
    assert run.metadata["subagent_source_refs"] == [embedded.source_ref, by_file.source_ref]
    assert embedded.metadata["parent_source_ref"] == by_file.metadata["parent_source_ref"] == trial
    delegations = {s.payload["tool_call_id"]: s for s in run.steps if s.payload.get("subagent_source_ref")}
    assert delegations["call_2_2"].payload["subagent_source_ref"] == embedded.source_ref
    assert delegations["call_2_2"].text == "verified"
    assert delegations["call_2_3"].payload["subagent_source_ref"] == by_file.source_ref
    assert delegations["call_2_3"].text == "subagent: subagent-checker.trajectory.json"
    assert [s.command for s in embedded.steps if s.kind == "command"] == ["/app/run.sh\n"]
    assert by_file.steps[-1].response_text == "mode is 0755 now"
    assert run.reward == 1.0 and run.success is True and run.metadata["outcome_derived"]
    assert embedded.reward is None, "a subagent's run does not inherit the trial's reward"


def test_copied_context_is_marked() -> None:
    run, *_ = read_all(HARBOR_BUILT / "result.json")
    assert run.steps[-1].text == "Earlier context, replayed after a summarisation."
    assert run.steps[-1].payload["is_copied_context"] is True


def test_a_trial_that_raised_is_an_infra_error_with_no_steps_and_its_exception() -> None:
    [run] = read_all(HARBOR_BROKEN / "result.json")
    assert (run.status, run.reward, run.success, run.steps) == ("infra_error", None, None, [])
    assert run.metadata["harbor"]["exception"]["exception_type"] == "AgentSetupTimeoutError"
    assert "exception_traceback" not in run.metadata["harbor"]["exception"]


def test_the_reward_comes_from_the_verifiers_file_when_the_result_has_none(tmp_path: Path) -> None:
    trial = shutil.copytree(HARBOR_BUILT, tmp_path / "trial")
    result = raw_json(trial / "result.json")
    result["verifier_result"] = None
    (trial / "result.json").write_text(json.dumps(result))
    run, *_ = read_all(trial / "result.json")
    assert (trial / "verifier" / "reward.txt").read_text() == "1\n" and run.reward == 1.0


def test_a_reward_of_the_wrong_kind_is_an_error_naming_it(tmp_path: Path) -> None:
    trial = shutil.copytree(HARBOR_BUILT, tmp_path / "trial")
    result = raw_json(trial / "result.json")
    result["verifier_result"]["rewards"]["reward"] = "passed"
    (trial / "result.json").write_text(json.dumps(result))
    with pytest.raises(ImportValidationError, match="verifier_result.rewards.reward' must be a number"):
        read_all(trial / "result.json")


def test_token_ids_of_the_wrong_kind_are_an_error_naming_the_field(tmp_path: Path) -> None:
    trial = shutil.copytree(HARBOR_BUILT, tmp_path / "trial")
    trajectory = raw_json(trial / "agent" / "trajectory.json")
    trajectory["steps"][2]["metrics"]["completion_token_ids"] = [1, "2", 3]
    (trial / "agent" / "trajectory.json").write_text(json.dumps(trajectory))
    with pytest.raises(ImportValidationError, match=r"steps\[2\].metrics.completion_token_ids' must be a list of "
                                                    r"integers, holds '2'"):
        read_all(trial / "result.json")


def test_a_subagent_file_outside_the_trial_is_not_read(tmp_path: Path) -> None:
    trial = shutil.copytree(HARBOR_BUILT, tmp_path / "trial")
    (tmp_path / "secret.json").write_text(json.dumps(raw_json(trial / "agent" / "subagent-checker.trajectory.json")))
    trajectory = raw_json(trial / "agent" / "trajectory.json")
    trajectory["steps"][4]["observation"]["results"][2]["subagent_trajectory_ref"] = [
        {"trajectory_path": "../../secret.json"}]
    (trial / "agent" / "trajectory.json").write_text(json.dumps(trajectory))
    refs = [r.source_ref for r in read_all(trial / "result.json")]
    assert refs == ["harbor:5a1c9e7d-0f3b-4e2a-8c6d-9b4f2e1a7c30", "harbor:5a1c9e7d-0f3b-4e2a-8c6d-9b4f2e1a7c30/verifier-1"]


def test_a_subagent_file_that_links_out_of_the_trial_is_not_read(tmp_path: Path) -> None:
    trial = shutil.copytree(HARBOR_BUILT, tmp_path / "trial")
    (tmp_path / "secret.json").write_text((trial / "agent" / "subagent-checker.trajectory.json").read_text())
    (trial / "agent" / "subagent-checker.trajectory.json").unlink()
    (trial / "agent" / "subagent-checker.trajectory.json").symlink_to(tmp_path / "secret.json")
    assert len(read_all(trial / "result.json")) == 2, "the embedded subagent only"


def test_subagent_files_that_name_each_other_are_read_once(tmp_path: Path) -> None:
    folder = tmp_path / "agent"
    folder.mkdir()
    for name, other in (("a.json", "b.json"), ("b.json", "a.json")):
        (folder / name).write_text(json.dumps({
            "schema_version": "ATIF-v1.7", "session_id": name, "agent": {"name": "x", "version": "1"},
            "steps": [{"step_id": 1, "source": "agent", "message": "",
                       "observation": {"results": [{"subagent_trajectory_ref": [{"trajectory_path": other}]}]}}]}))
    assert [r.source_ref for r in read_all(folder / "a.json")] == ["atif:a.json", "atif:a.json/b.json"]


def test_the_public_v1_7_multiagent_file_gives_a_parent_and_its_embedded_subagent() -> None:
    parent, child = read_all(ATIF_V17)
    raw = raw_json(ATIF_V17)
    assert (parent.source_ref, child.source_ref) == ("atif:harbor-golden-run", "atif:harbor-golden-run/traj_child_golden")
    assert parent.metadata["atif"]["trajectory_id"] == "traj_root_golden"
    worker = next(s for s in parent.steps if s.payload.get("tool_call_id") == "call_worker" and s.kind == "observation")
    assert worker.payload["subagent_source_ref"] == child.source_ref and worker.text == "worker complete"
    shell = next(s for s in parent.steps if s.kind == "command")
    assert (shell.command, shell.output) == ("pwd", raw["steps"][1]["observation"]["results"][0]["content"])
    assert [s.response_text for s in child.steps if s.kind == "model_call"] == ["worker complete"]
    assert child.metadata["atif"]["agent"]["name"] == "worker[1]"


def test_an_embedded_subagent_without_a_trajectory_id_is_an_error(tmp_path: Path) -> None:
    raw = raw_json(ATIF_V17)
    del raw["subagent_trajectories"][0]["trajectory_id"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ImportValidationError, match=r"subagent_trajectories\[0\].trajectory_id' missing"):
        read_all(path)


def test_a_trajectory_with_neither_session_nor_trajectory_id_is_an_error(tmp_path: Path) -> None:
    raw = raw_json(ATIF_V17)
    del raw["session_id"], raw["trajectory_id"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ImportValidationError, match="session_id' missing"):
        read_all(path)


@pytest.mark.django_db
def test_importing_a_job_folder_stores_each_trial_once_with_its_subagents(tmp_path: Path) -> None:
    from django.core.management import call_command

    from experience.models import Trajectory

    job = shutil.copytree(HARBOR_BUILT_JOB, tmp_path / "job")
    out = StringIO()
    call_command("import", str(job), "--json", "--no-progress", "--no-index", stdout=out)
    report = json.loads(out.getvalue())
    by_file = {Path(f["path"]).relative_to(job).as_posix(): f["status"] for f in report["files"]}
    assert by_file == {  # each trial read once: from its trajectory, else its result
        "fix-permissions__Q7mK2xP/agent/trajectory.json": "imported",
        "broken-env__Zz9Yy8X/result.json": "imported",
        "broken-env__Zz9Yy8X/agent/setup.log": "unrecognised",
        "fix-permissions__Q7mK2xP/config.json": "unrecognised",
        "fix-permissions__Q7mK2xP/verifier/reward.txt": "unrecognised",
        "result.json": "unrecognised",  # the job's summary is no trial
    }
    assert report["imported"] == 4  # two trials, and the fix-permissions trial's two subagents
    trial = Trajectory.objects.get(source_ref="harbor:5a1c9e7d-0f3b-4e2a-8c6d-9b4f2e1a7c30")
    assert (trial.reward, trial.success, trial.task_key, trial.task_set) == (1.0, True, "fix-permissions", "terminal-bench")
    assert Trajectory.objects.get(source_ref="harbor:9d2e4f60-7a8b-4c1d-9e0f-1a2b3c4d5e6f").status == "infra_error"
    assert Trajectory.objects.filter(metadata__parent_source_ref=trial.source_ref).count() == 2
    trajectory = (job / "fix-permissions__Q7mK2xP" / "agent" / "trajectory.json").read_bytes()
    assert trial.original_blob == hashlib.sha256(trajectory).hexdigest(), "the trajectory is the original kept"
