"""Trove's REST API from a training loop. Standard library only: importable without Django or requests.

Example::

    from trove_client import TroveClient

    trove = TroveClient("http://127.0.0.1:8000", token="<your API token>")
    print([e["name"] for e in trove.list_endpoints()])   # model endpoints an admin or ops registered
    job = trove.submit_job(
        task_set="demo-python-bugfix", fleet="local-demo",
        endpoint="my-policy-server", model_name="my-policy",   # the endpoint holds the URL and the key
        samples_per_task=8, sampling="adaptive", adaptive_first_round=2,
        max_steps=30, concurrency=8,
    )
    for rollout in trove.iter_finished_rollouts(job["id"], poll_interval=5):
        if rollout["status"] in ("succeeded", "failed"):   # infra_error / cancelled are not training data
            run = trove.get_trajectory(rollout["trajectory_id"])   # provenance, outcome and its steps
            train_on(run, reward=rollout["reward"])
        save_checkpoint(cursor=rollout["cursor"])           # resume later with after=cursor
    print(trove.job_status(job["id"])["budget"]["per_task"])

A token comes from `manage.py drf_create_token <username>` (or the admin's Tokens page).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class TroveAPIError(Exception):
    """The API answered with an error. `status` is the HTTP status; `field` names the bad input, if any."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        detail = body.get("detail", body) if isinstance(body, dict) else body
        self.field = body.get("field") if isinstance(body, dict) else None
        super().__init__(f"HTTP {status}: {detail}")


class TroveClient:
    """One Trove server, one API token. Methods return the API's JSON as dicts."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # --- jobs --------------------------------------------------------------------------------------

    def submit_job(self, *, task_set: str, fleet: str, endpoint: str, model_name: str | None = None,
                   samples_per_task: int = 1, sampling: str = "uniform", harness: str = "builtin",
                   **options: Any) -> dict:
        """Start a rollout job against the registered model endpoint `endpoint` (see list_endpoints) and one of
        its models (default: its first). `harness`: "builtin" (Trove's own loop), a preset of the harness
        catalogue ("claude-code", "codex", "opencode", "mini-swe-agent", "qwen-code", "gemini-cli"; "NAME@VERSION"
        for a version other than the pinned one, which the server must have installed), or "external" with
        `harness_command=` (any CLI agent). Other options: name, task_keys, max_steps, max_tokens,
        wall_time_s, concurrency, adaptive_first_round. Returns the job with its status; its `harness` is the
        stored form (a preset as NAME@VERSION)."""
        body = {"task_set": task_set, "fleet": fleet, "endpoint": endpoint, "samples_per_task": samples_per_task,
                "sampling": sampling, "harness": harness, **options}
        if model_name:
            body["model_name"] = model_name
        return self._request("POST", "/api/v1/jobs/", body)

    def job_status(self, job_id: int) -> dict:
        """The job: status, progress (finished / total, success rate) and budget (spent per task)."""
        return self._request("GET", f"/api/v1/jobs/{job_id}/")

    def list_jobs(self) -> list[dict]:
        """The most recent jobs (first page)."""
        return self._request("GET", "/api/v1/jobs/")["results"]

    def finished_rollouts(self, job_id: int, *, after: str | int = 0, limit: int = 100) -> dict:
        """One page of rollouts that finished after the cursor `after`: results, next_cursor, has_more, done."""
        query = urllib.parse.urlencode({"after": after, "limit": limit})
        return self._request("GET", f"/api/v1/jobs/{job_id}/rollouts/?{query}")

    def iter_finished_rollouts(self, job_id: int, *, after: str | int = 0, poll_interval: float = 5.0,
                               limit: int = 100, timeout: float | None = None) -> Iterator[dict]:
        """Every rollout of the job as it finishes, in finish order, until the job has ended.

        Follows the cursor: each rollout carries its own `cursor`, so a trainer that stops can resume with
        `after=` the last one it handled. Sleeps `poll_interval` seconds between empty polls. With `timeout`,
        raises TimeoutError if the job has not ended that many seconds after the first poll.
        """
        cursor = after
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            page = self.finished_rollouts(job_id, after=cursor, limit=limit)
            yield from page["results"]
            cursor = page["next_cursor"]
            if page["done"]:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {page['job_status']} after {timeout} s (cursor {cursor})")
            if not page["has_more"]:
                time.sleep(poll_interval)

    def iter_samples(self, job_id: int, *, after: str | int = 0, poll_interval: float = 5.0,
                     limit: int = 20, timeout: float | None = None) -> Iterator[dict]:
        """Every RL sample of the job as its rollouts finish (succeeded or failed ones), until the job has
        ended: token_ids, loss_mask, logprobs, reward, exact, fork, policy_version and the group keys
        (rollout_id, task, rollout_sample_index, sample).

        A sample's `cursor` is its rollout's: a trainer that stops resumes with `after=` the cursor of the
        last rollout whose samples it has all handled. `limit`: rollouts per page. Sleeps `poll_interval`
        between empty polls; with `timeout`, raises TimeoutError if the job has not ended by then.
        """
        cursor = after
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            query = urllib.parse.urlencode({"after": cursor, "limit": limit})
            page = self._request("GET", f"/api/v1/jobs/{job_id}/samples/?{query}")
            yield from page["results"]
            cursor = page["next_cursor"]
            if page["done"]:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {page['job_status']} after {timeout} s (cursor {cursor})")
            if not page["has_more"]:
                time.sleep(poll_interval)

    def cancel_job(self, job_id: int) -> dict:
        """Cancel the job: queued rollouts never start, running ones stop at their next heartbeat."""
        return self._request("POST", f"/api/v1/jobs/{job_id}/cancel/", {})

    def rerun_failed(self, job_id: int, *, statuses: list[str] | None = None) -> dict:
        """Re-run a finished job's failed and infra_error samples (or only `statuses`) in the same job."""
        return self._request("POST", f"/api/v1/jobs/{job_id}/rerun-failed/", {"statuses": statuses} if statuses else {})

    def cancel_rollout(self, rollout_id: int) -> dict:
        return self._request("POST", f"/api/v1/rollouts/{rollout_id}/cancel/", {})

    # --- model endpoints -----------------------------------------------------------------------------

    def list_endpoints(self) -> list[dict]:
        """The registered model endpoints a job may name (first page): name, protocol, model_names, ..."""
        return self._request("GET", "/api/v1/endpoints/")["results"]

    def register_endpoint(self, *, name: str, base_url: str, model_names: list[str], protocol: str = "chat",
                          key_ref: str = "", allow_private_network: bool = False, description: str = "") -> dict:
        """Register a model endpoint (needs an ops token: `endpoints:write`). `key_ref` says where the key lives
        (env:TROVE_MODEL_KEY_... or file:NAME in the server's secrets directory), never the key itself."""
        return self._request("POST", "/api/v1/endpoints/", {
            "name": name, "base_url": base_url, "model_names": model_names, "protocol": protocol,
            "key_ref": key_ref, "allow_private_network": allow_private_network, "description": description})

    # --- trajectories --------------------------------------------------------------------------------

    def get_trajectory(self, trajectory_id: int) -> dict:
        """A recorded run (provenance, outcome, counts) with its first page of steps; `steps_next` pages on."""
        return self._request("GET", f"/api/v1/trajectories/{trajectory_id}/")

    def label_outcomes(self, report: str | Path | dict | list, *, name: str | None = None,
                       filter: dict | None = None, dry_run: bool = False) -> dict:
        """Label stored runs from an evaluation report, as `manage.py outcomes` does: a SWE-bench summary or
        per-instance report.json, or JSONL of {trajectory_id | source_ref | task_key [, sample], reward, success}
        (a path, the text, or the JSON: a report object or a list of outcome objects). `filter` narrows the runs
        that may be labelled (the list endpoint's filters); `dry_run` says what would change and writes nothing.
        Each change is a curation event naming the report. Needs a curator's token."""
        if isinstance(report, Path):
            name, report = name or report.name, report.read_text()
        body: dict[str, Any] = {"report": report, "filter": filter or {}, "dry_run": dry_run}
        if name:
            body["name"] = name
        return self._request("POST", "/api/v1/outcomes/", body)

    # --- task sets ---------------------------------------------------------------------------------

    def upload_task_set(self, name: str, jsonl: str | Path, *, description: str = "") -> dict:
        """Import a JSONL task set (a path or the text itself). Nothing is written if any line is bad."""
        text = Path(jsonl).read_text() if isinstance(jsonl, Path) else jsonl
        return self._request("POST", "/api/v1/task-sets/", {"name": name, "jsonl": text, "description": description})

    def list_task_sets(self) -> list[dict]:
        return self._request("GET", "/api/v1/task-sets/")["results"]

    # --- plumbing ----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Token {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {}),
        })
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            raise TroveAPIError(error.code, parsed) from None
