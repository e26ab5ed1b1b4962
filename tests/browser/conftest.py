"""Headless Debian Chromium driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("TROVE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]


# Module scope, not session: while Playwright's sync API runs it holds an event loop on the main thread, and
# tests after it that use asyncio (the proxy's) would find a loop already running.
@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: `apt-get install chromium` (.ci/run does)")
    # Playwright's sync API refuses to run inside a running asyncio loop; Django's async-unsafe guard
    # also needs this for the live_server ORM calls made from the test thread.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    yield page
    context.close()


def _log_in(page, live_server, django_user_model, username: str):
    """A user in every role (the browser tests act in all of them), logged in through the login form."""
    from webapp.access.roles import role_groups_sync

    user = django_user_model.objects.create_user(username=username, password="s3cret-pass-123")
    user.groups.add(*role_groups_sync().values())
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "s3cret-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


@pytest.fixture
def logged_in_page(page, live_server, django_user_model):
    return _log_in(page, live_server, django_user_model, "researcher")


@pytest.fixture
def phone_page(browser, live_server, django_user_model):
    """Logged in on a 390 px touch screen (a phone)."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    yield _log_in(context.new_page(), live_server, django_user_model, "phone")
    context.close()
