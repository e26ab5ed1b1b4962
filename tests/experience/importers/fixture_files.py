"""Paths to the real trajectory fixtures (shared folder) and to the sample files written for formats that
have no public fixture here (see tests/shared_paths.py for where the fixtures are found)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.shared_paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR
SAMPLES = Path(__file__).resolve().parent / "samples"

SWE_AGENT = FIXTURES / "swe-agent"
SWE_TEST_DATA = SWE_AGENT / "tests" / "test_data" / "trajectories"
PYDICOM = (
    SWE_TEST_DATA
    / "gpt4__swe-bench-dev-easy_first_only__default__t-0.00__p-0.95__c-3.00__install-1"
    / "pydicom__pydicom-1458.traj"
)
ALL_PREDS = PYDICOM.parent / "all_preds.jsonl"
TEST_REPO_FC = (
    SWE_TEST_DATA
    / "gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1"
    / "6e44b9__sweagenttestrepo-1c2844.traj"
)
DEMOS = SWE_AGENT / "trajectories" / "demonstrations"
OPENHANDS = FIXTURES / "openhands"
MULTI_SWE = OPENHANDS / "evaluation" / "benchmarks" / "multi_swe_bench" / "examples" / "output.jsonl"
RESOLVER = OPENHANDS / "tests" / "unit" / "resolver" / "mock_output" / "output.jsonl"
EVENT_STREAMS = OPENHANDS / "tests" / "runtime" / "trajs"
INSPECT = FIXTURES / "inspect-ai"
BROWSER = INSPECT / "tests" / "analysis" / "test_logs" / "2025-05-12T20-27-36-04-00_browser.json"
SECURITY_GUIDE = (
    INSPECT / "tests" / "analysis" / "test_logs" / "2025-05-12T20-28-26-04-00_security-guide.json"
)
EVAL_ZIP = INSPECT / "tests" / "log" / "test_eval_log" / "log_streaming.eval"
MINI_V1 = SAMPLES / "example__calc-17.traj.json"
MINI_V2 = SAMPLES / "django__django-11099.traj.json"
ATIF_SAMPLE = SAMPLES / "hello-world.trajectory.json"
CONVERSATIONS = SAMPLES / "conversations.jsonl"
TAU_BENCH = SAMPLES / "tau-bench" / "gpt-4o-airline.json"
SWE_AGENT_ROWS = SAMPLES / "swe-agent-rows" / "nebius-rows.jsonl"
ADP_RAW = SAMPLES / "swe-agent-rows" / "adp-sample-raw.json"
CODEX_REAL = SAMPLES / "codex" / "rollout-2025-12-28T12-18-30-019b64e5-57fa-7463-b644-fba7e456f905.jsonl"
CODEX_TOOLS = SAMPLES / "codex" / "rollout-tools.jsonl"
CODEX_CCL = SAMPLES / "codex" / "rollout-2026-01-02T03-04-05-11111111-1111-4111-8111-111111111111.jsonl"
SWE_BENCH = SAMPLES / "swe-bench"
SWE_BENCH_SUMMARY = SWE_BENCH / "swe-agent-llama-70b.nebius-eval.json"
SWE_BENCH_INSTANCE = (SWE_BENCH / "logs" / "run_evaluation" / "nebius-eval" / "swe-agent-llama-70b"
                      / "django__django-11099" / "report.json")
CLAUDE_CODE = SAMPLES / "claude-code"
CLAUDE_SESSION = CLAUDE_CODE / "-home-dev-calc" / "7f3c2a10-5b1e-4c2d-9a8f-0e6d4b3c2a11.jsonl"
CLAUDE_SUBAGENT = CLAUDE_SESSION.with_suffix("") / "subagents" / "agent-a9e41c07.jsonl"
CLAUDE_CODE_LOG = CLAUDE_CODE / "claude-code-log" / "55550000-0000-4000-8000-000000000001.jsonl"
CLAUDE_CODE_LOG_AGENT = CLAUDE_CODE_LOG.with_suffix("") / "subagents" / "agent-showcol2.jsonl"
CLAUDE_WINDOWS = CLAUDE_CODE / "C--Users-dev-proj" / "0b9d8e7f-1a2b-4c3d-8e9f-a0b1c2d3e4f5.jsonl"

HARBOR = SAMPLES / "harbor"
HARBOR_REAL_JOB = HARBOR / "2026-02-09__00-15-22"
HARBOR_REAL = HARBOR_REAL_JOB / "computer-use-oncall-debug__kFdZhTa"
HARBOR_BUILT_JOB = HARBOR / "built-job"
HARBOR_BUILT = HARBOR_BUILT_JOB / "fix-permissions__Q7mK2xP"
HARBOR_BROKEN = HARBOR_BUILT_JOB / "broken-env__Zz9Yy8X"
ATIF_V17 = SAMPLES / "atif" / "harbor_multiagent_v1_7.json"
# Not importable: a format that looks like Claude Code's (Qwen Code 0.24.4, the catalogue's qwen-code)
QWEN_SESSION = SAMPLES / "qwen-code" / "e5ba2925-66bc-4e5f-888d-36897653cca3.jsonl"

SWE_AGENT_FILES = sorted(SWE_AGENT.rglob("*.traj"))

# Every trajectory file we can read, and the format detection must name for it.
EXPECTED_FORMATS: dict[Path, str] = {
    **{path: "swe_agent" for path in SWE_AGENT_FILES},
    MULTI_SWE: "openhands",
    RESOLVER: "openhands",
    **{path: "openhands" for path in sorted(EVENT_STREAMS.glob("*.json"))},
    BROWSER: "inspect",
    SECURITY_GUIDE: "inspect",
    EVAL_ZIP: "inspect",
    MINI_V1: "mini_swe_agent",
    MINI_V2: "mini_swe_agent",
    ATIF_SAMPLE: "atif",
    CONVERSATIONS: "openai_messages",
    TAU_BENCH: "openai_conversations",
    SWE_AGENT_ROWS: "swe_agent_rows",
    ADP_RAW: "swe_agent_rows",
    CLAUDE_SESSION: "claude_code",
    CLAUDE_SUBAGENT: "claude_code",
    CLAUDE_WINDOWS: "claude_code",
    CLAUDE_CODE_LOG: "claude_code",
    CLAUDE_CODE_LOG_AGENT: "claude_code",
    CODEX_REAL: "codex",
    CODEX_TOOLS: "codex",
    CODEX_CCL: "codex",
    HARBOR_REAL / "result.json": "harbor",
    HARBOR_REAL / "agent" / "trajectory.json": "harbor",
    HARBOR_BUILT / "result.json": "harbor",
    HARBOR_BUILT / "agent" / "trajectory.json": "harbor",
    HARBOR_BUILT / "agent" / "subagent-checker.trajectory.json": "harbor",
    HARBOR_BROKEN / "result.json": "harbor",
    ATIF_V17: "atif",
}
ALL_FILES = list(EXPECTED_FORMATS)


def label(path: Path) -> str:
    """A short readable test id: the last folder and the file name."""
    return f"{path.parent.name[:40]}/{path.name}"


def raw_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


def raw_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
