"""Confirmation before an action that changes or ends work (start, cancel, re-run, drain).

A form posts to its action; without `confirmed=yes` the action does nothing and answers with a page that
says, in numbers, what it will do, and a button that posts the same fields again with `confirmed=yes`. The
page works without JavaScript, and a stray or replayed click can never act unseen. The figures are read when
the page is shown; the action reports what it really changed.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

CONFIRMED = "yes"


def is_confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirmed") == CONFIRMED


def confirmation_page(request: HttpRequest, *, title: str, will: list[str], button: str, back_url: str,
                      danger: bool = True) -> HttpResponse:
    """The page asking to confirm: `will` is what the action does, one line each; the form re-posts the
    request's own fields (never the CSRF token, which the template adds fresh)."""
    fields = [(name, value) for name, values in request.POST.lists() if name not in ("csrfmiddlewaretoken", "confirmed")
              for value in values]
    return render(request, "dashboard/confirm.html", {
        "title": title, "will": will, "button": button, "back_url": back_url, "fields": fields,
        "action_url": request.path, "danger": danger, "confirmed": CONFIRMED,
    })
