"""Read a job's counts, and a run's, from every place that shows them: the job page, its live feed, the
overview, the API's job and jobs list, the run page and the API's run. Each reader returns the counts that
view shows, by the same names, so a test can ask that all of them agree with each other and with the rows.
Pages are read as served (server-rendered HTML), by the ids and classes the templates give those numbers."""

from __future__ import annotations

import html
import json
import re
from urllib.parse import parse_qs, urlsplit

from experience.models import Step, Trajectory
from webapp.rollouts.models import Rollout, RolloutJob


def _int(pattern: str, text: str) -> int:
    found = re.search(pattern, text, re.S)
    assert found, f"{pattern!r} not on the page"
    return int(found.group(1))


def _by_status(progress: dict) -> dict:
    statuses = progress["by_status"]
    return {status: statuses.get(status, 0) for status in ("succeeded", "failed", "infra_error")}


def from_api_detail(client, job: RolloutJob) -> dict:
    body = client.get(f"/api/v1/jobs/{job.pk}/").json()
    progress, budget = body["progress"], body["budget"]
    return {"total": progress["total"], "issued": progress["issued"], "finished": progress["finished"],
            "running": progress["running"], "queued": progress["queued"], "concurrency": progress["concurrency"],
            "spent": budget["spent"], **_by_status(progress)}


def from_live_feed(client, job: RolloutJob) -> dict:
    snap = client.get(f"/api/v1/jobs/{job.pk}/live/").json()
    progress = snap["progress"]
    cells = [cell for row in snap["grid"] for cell in row["cells"]]
    return {"total": progress["total"], "issued": len(cells), "finished": progress["finished"],
            "running": sum(1 for c in cells if c[1] == "running"), "queued": progress["queued"],
            "concurrency": snap["job"]["concurrency"], "spent": snap["budget"]["spent"], **_by_status(progress)}


def from_job_page(client, job: RolloutJob) -> dict:
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    by_status = dict(re.findall(r"<li>(\w+): (\d+)</li>", page.split('id="by-status"', 1)[1].split("</ul>", 1)[0]))
    return {
        "finished": _int(r'id="progress">(\d+)/\d+ finished', page),
        "total": _int(r'id="progress">\d+/(\d+) finished', page),
        "running": _int(r'id="running">(\d+) of at most', page),
        "concurrency": _int(r'id="running">\d+ of at most (\d+)', page),
        "queued": _int(r'id="queued">(\d+)<', page),
        "spent": _int(r'id="budget-spent">(\d+) of', page),
        **{status: int(by_status.get(status, 0)) for status in ("succeeded", "failed", "infra_error")},
    }


def from_overview(client, job: RolloutJob) -> dict:
    page = client.get("/").content.decode()
    row = page.split(f'<tr data-job="{job.pk}">', 1)[1].split("</tr>", 1)[0]
    return {
        "finished": _int(r'class="progress">.*?</progress> (\d+)/\d+', row),
        "total": _int(r'class="progress">.*?</progress> \d+/(\d+)', row),
        "running": _int(r'class="running">(\d+) of', row),
        "concurrency": _int(r'class="running">\d+ of (\d+)', row),
        "succeeded": _int(r'class="succeeded">(\d+)<', row),
        "infra_error": _int(r'class="infra">(\d+)<', row),
    }


def from_api_list(client, job: RolloutJob) -> dict:
    rows = client.get("/api/v1/jobs/").json()["results"]
    row = next(r for r in rows if r["id"] == job.pk)
    return {"issued": row["n_rollouts"], "finished": row["n_finished"], "succeeded": row["n_succeeded"],
            "running": row["n_running"], "concurrency": row["concurrency"]}


JOB_VIEWS = {"api": from_api_detail, "live": from_live_feed, "job page": from_job_page,
             "overview": from_overview, "api list": from_api_list}


def job_rows(job: RolloutJob) -> dict:
    """The counts from the rows themselves (a uniform job: its total is what it created)."""
    rollouts = list(Rollout.objects.filter(job=job).values_list("status", "started_at"))
    count = {status: sum(1 for s, _ in rollouts if s == status) for status in Rollout.Status.values}
    return {"total": len(rollouts), "issued": len(rollouts),
            "finished": sum(count[s] for s in Rollout.FINISHED), "running": count["running"],
            "queued": count["queued"], "concurrency": RolloutJob.objects.get(pk=job.pk).concurrency,
            "spent": sum(1 for s, started in rollouts if s != "queued" and started is not None),
            "succeeded": count["succeeded"], "failed": count["failed"], "infra_error": count["infra_error"]}


def job_disagreements(client, job: RolloutJob) -> list[str]:
    """Every count a view shows that differs from the rows' (so from any other view's), as readable lines."""
    truth = job_rows(job)
    seen = {name: read(client, job) for name, read in JOB_VIEWS.items()}
    return [f"{name}: {key} {value} (rows say {truth[key]})"
            for name, counts in seen.items() for key, value in counts.items() if value != truth[key]]


def run_views(client, trajectory_id: int) -> dict[str, dict]:
    """A run's step and model-call counts as its page summarises them, as its page lists them, as the API
    gives them, and as the rows are."""
    raw = client.get(f"/trajectories/{trajectory_id}/").content.decode()
    page, listed = html.unescape(raw), _listed_kinds(client, raw)
    api = client.get(f"/api/v1/trajectories/{trajectory_id}/").json()
    kinds = list(Step.objects.filter(trajectory_id=trajectory_id).values_list("kind", flat=True))
    stored = Trajectory.objects.get(pk=trajectory_id)
    return {
        "run page summary": {"steps": _int(r'class="label">Steps</span> (\d+)', page),
                             "model_calls": _int(r'class="label">Model calls</span> (\d+)', page)},
        "run page steps": {"steps": len(listed), "model_calls": listed.count("model_call")},
        "api": {"steps": api["n_steps"], "model_calls": api["n_model_calls"]},
        "trajectory row": {"steps": stored.n_steps, "model_calls": stored.n_model_calls},
        "step rows": {"steps": len(kinds), "model_calls": kinds.count("model_call")},
    }


def _listed_kinds(client, page: str) -> list[str]:
    """The kinds of the steps the run page lists: rendered in it, or (a page that draws its steps itself)
    the steps it embeds and then those it fetches from its steps API as the reader scrolls, to the end."""
    rendered = re.findall(r'<li class="step kind-([a-z_]+)', page)
    config = re.search(r'<script id="run-config" type="application/json">(.*?)</script>', page, re.S)
    if rendered or config is None:
        return rendered
    run = json.loads(config.group(1))
    kinds = [view["kind"] for view in run["first"]]
    url = re.search(r'data-steps-api="([^"]+)"', page).group(1)
    after = run["next_after"]
    while after is not None:
        body = client.get(url, {"after": after}).json()
        kinds += [step["kind"] for step in body["results"]]
        after = _after(body["next"])
    return kinds


def _after(next_url: str | None) -> int | None:
    if not next_url:
        return None
    return int(parse_qs(urlsplit(next_url).query)["after"][0])
