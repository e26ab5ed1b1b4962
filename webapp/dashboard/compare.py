"""Two runs compared step by step (/trajectories/compare/?a=<id>&b=<id>). Thin: parse ids, one selector, a
template. Deep-linkable: the URL names both runs. /trajectories/<id>/compare-similar/ picks B for you: the
nearest run of the same task in the dedup index, and redirects to the compare page naming both."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from experience.errors import NotFound
from experience.run_steps import run_compare
from experience.selectors import trajectory_get
from experience.services.dedup import similar_runs
from experience.steps_view import diff_lines
from webapp.access.permissions import scope_required
from webapp.api.ranges import ID_MAX

MATCH_RUN_SHOWN = 3  # matched pairs shown either side of a difference; longer runs of matches fold away


@scope_required("trajectories")
def trajectory_compare(request: HttpRequest) -> HttpResponse:
    ids, problems = _ids(request)
    if problems:
        return render(request, "dashboard/trajectory_compare.html", {"problems": problems, "given": request.GET},
                      status=400 if any(request.GET.get(k) for k in ("a", "b")) else 200)
    try:
        a, b = (trajectory_get(trajectory_id=i) for i in ids)
    except NotFound as error:
        raise Http404(str(error)) from None
    result = run_compare(a=a, b=b)
    return render(request, "dashboard/trajectory_compare.html", {
        **result, "rows": _fold(result["pairs"]), "given": request.GET,
        "patch_lines": diff_lines(result["patch_diff"], nested=True),
        "patch_a": diff_lines(a.final_diff), "patch_b": diff_lines(b.final_diff),
    })


@scope_required("trajectories")
def trajectory_compare_similar(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    """Compare a run with its nearest neighbour of the same task (FAISS over signature embeddings). Computed
    on click, not on the run page: the index lookup stays off the page's time to interactive."""
    try:
        trajectory = trajectory_get(trajectory_id=trajectory_id)
        nearest = similar_runs(trajectory_id=trajectory.pk, k=1, same_task=True)
    except NotFound as error:
        raise Http404(str(error)) from None
    if not nearest:
        problem = f"No other run of task {trajectory.task_key} is in the similarity index yet: give run B's id."
        return render(request, "dashboard/trajectory_compare.html",
                      {"problems": [problem], "given": {"a": trajectory.pk}}, status=404)
    other, _score = nearest[0]
    return redirect(f"{reverse('dashboard:trajectory-compare')}?a={trajectory.pk}&b={other.pk}")


def _ids(request: HttpRequest) -> tuple[list[int], list[str]]:
    ids, problems = [], []
    for name in ("a", "b"):
        value = (request.GET.get(name) or "").strip().lstrip("#")
        if not value.isdigit() or not 0 < int(value) <= ID_MAX:
            problems.append(f"{name}: give a run's id (a positive number)" if value else f"{name}: missing")
        else:
            ids.append(int(value))
    return ids, problems


def _fold(pairs: list) -> list[dict]:
    """Rows for the table: each pair with its position, long runs of matches folded into one row."""
    rows: list[dict] = []
    near = {i for i, pair in enumerate(pairs) if pair.op != "match"}
    shown = {i for j in near for i in range(j - MATCH_RUN_SHOWN, j + MATCH_RUN_SHOWN + 1)}
    folded = 0
    for index, pair in enumerate(pairs):
        if pair.op == "match" and index not in shown:
            folded += 1
            continue
        if folded:
            rows.append({"folded": folded})
            folded = 0
        rows.append({"index": index, "pair": pair})
    if folded:
        rows.append({"folded": folded})
    return rows
