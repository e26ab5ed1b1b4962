"""`manage.py demo`: seed, run a rollout job of every demo task x N samples, print a summary, serve.

The demo model is an offline stand-in for a real model server; any OpenAI-compatible base URL works in
its place (`--model-url`). Either is registered as a model endpoint (`demo-model`, `demo-external`) with
private addresses allowed: whoever runs `manage.py demo` administers this Trove. The demo model's endpoint has
token capture on (`token_capture: vllm`, which the demo model answers), so the job's runs are exact RL samples;
a `--model-url` server's has it off.

`--harness NAME[@VERSION]` runs the job with a preset of the harness catalogue (Claude Code, Codex, opencode,
mini-swe-agent, ...) instead of the built-in loop: its bundle is installed first if it is not yet (progress
shown), the rollouts run in a proxy-only fleet (the harness reaches the model only through the proxy), and
the summary names the harness, its version and the protocol it spoke.
"""

from __future__ import annotations

import signal
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Sum

from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import job_create, job_progress
from workers.harness.presets import UnknownHarness, resolve
from workers.harness.presets.bundles import InstallFailed, bundle_installed, harness_install
from workers.seed import DEMO_MODEL_NAME, seed_admin, seed_demo_endpoint, seed_demo_task_set, seed_local_fleet
from workers.stack import demo_model_v1, start_embedded_stack
from workers.tasks.fleets import reconcile_all
from workers.tasks.rollouts import enqueue_rollout


class Command(BaseCommand):
    help = "Seed the demo, run a rollout job through the demo model, print a summary, then serve the dashboard."

    def add_arguments(self, parser):
        parser.add_argument("--samples", type=int, default=4)
        parser.add_argument("--max-steps", type=int, default=20)
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument("--tasks", type=int, default=0, help="only the first N demo tasks (0 = all)")
        parser.add_argument("--model-url", default="", help="an OpenAI-compatible base URL instead of the demo model")
        parser.add_argument("--model-name", default=DEMO_MODEL_NAME)
        parser.add_argument("--harness", default="builtin",
                            help="builtin, or a harness preset: NAME or NAME@VERSION (installed first if needed)")
        parser.add_argument("--serve", choices=("0", "1"), default=None,
                            help="serve the dashboard afterwards (default: DEMO_SERVE, else 1)")
        parser.add_argument("--addr", default="127.0.0.1:8000")

    def handle(self, *args, **options):
        # SIGTERM (a service manager, `kill`) stops the demo the way Ctrl-C does, so the sandboxes go with it.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._run(options)
        except KeyboardInterrupt:
            self.stdout.write("Stopped; its sandboxes were destroyed.")

    def _run(self, options):
        harness = self._harness(options["harness"])
        call_command("migrate", verbosity=0)
        task_set = seed_demo_task_set()
        fleet = seed_local_fleet() if harness == "builtin" else _harness_fleet()
        username, password = seed_admin()
        stack = start_embedded_stack(demo_model=not options["model_url"], concurrency=options["concurrency"])
        try:
            endpoint = self._endpoint(stack, options)
            self.stdout.write(f"Proxy on {stack.proxy_url}; model {options['model_name']} at {endpoint.base_url} "
                              f"(endpoint {endpoint.name}"
                              + (", demo stand-in, offline)" if not options["model_url"] else ")"))
            warm = self._warm_up(fleet, options["concurrency"])
            self.stdout.write(f"Fleet {fleet.name}: {warm} sandboxes warm; rollouts run {options['concurrency']} "
                              "at a time (--concurrency)")
            started = time.monotonic()
            job = job_create(task_set=task_set, fleet=fleet, endpoint=endpoint, model_name=options["model_name"],
                             samples_per_task=options["samples"], max_steps=options["max_steps"], harness=harness,
                             task_keys=self._task_keys(task_set, options["tasks"]),
                             name=f"demo: {task_set.name} x {options['samples']}", enqueue=enqueue_rollout)
            self._wait(job)
            self._summary(job, time.monotonic() - started)
            serve = options["serve"] if options["serve"] is not None else settings.TROVE_DEMO_SERVE
            if str(serve) == "1":
                self.stdout.write(self.style.SUCCESS(
                    f"Dashboard: http://{options['addr']}/  login: {username} / {password}"))
                call_command("serve", addr=options["addr"], embedded_started=True)
        finally:
            self.stdout.write("Stopping: destroying the demo's sandboxes ...")
            with _signals_held():  # a second Ctrl-C must not cut the cleanup short
                stack.stop()

    def _harness(self, name: str) -> str:
        """The job's harness as stored (NAME@VERSION for a preset), its bundle installed."""
        try:
            resolved = resolve(name)
        except UnknownHarness as error:
            raise CommandError(str(error)) from error
        if resolved is None:
            return name
        preset, version = resolved
        if not bundle_installed(settings.TROVE_HARNESS_DIR, preset, version):
            self.stdout.write(f"Installing {preset.name}@{version} ({preset.package.spec(version)}) into "
                              f"{settings.TROVE_HARNESS_DIR} ...")
            try:
                harness_install(preset=preset, version=version, root=settings.TROVE_HARNESS_DIR,
                                progress=self.stdout.write)
            except InstallFailed as error:
                raise CommandError(f"{preset.name}@{version} could not be installed: {error}") from error
        return f"{preset.name}@{version}"

    @staticmethod
    def _endpoint(stack, options):
        if options["model_url"]:
            # Token capture off: an arbitrary OpenAI-compatible server may refuse vLLM's extra fields.
            return seed_demo_endpoint(options["model_url"], name="demo-external", model_name=options["model_name"],
                                      description="The model server `manage.py demo --model-url` was given.",
                                      token_capture="off")
        return seed_demo_endpoint(demo_model_v1(stack.demo_model_url), model_name=options["model_name"])

    @staticmethod
    def _warm_up(fleet, concurrency: int, timeout_s: float = 60) -> int:
        """Fill the warm pool before the job starts (two sandboxes per concurrent rollout), so claims are warm
        from the first; the beat's reconciler keeps it topped up while the job runs."""
        from webapp.fleets.models import Sandbox
        from webapp.fleets.services import fleet_scale

        target = min(fleet.max_warm, max(fleet.min_warm, 2 * concurrency))
        if target != fleet.min_warm:
            fleet = fleet_scale(fleet=fleet, min_warm=target)
        deadline = time.monotonic() + timeout_s
        while True:
            reconcile_all()
            warm = Sandbox.objects.filter(fleet=fleet, state=Sandbox.State.WARM).count()
            if warm >= target or time.monotonic() > deadline:
                return warm
            time.sleep(0.5)

    @staticmethod
    def _task_keys(task_set, limit: int) -> list[str] | None:
        return list(task_set.tasks.order_by("key").values_list("key", flat=True)[:limit]) if limit else None

    def _wait(self, job: RolloutJob) -> None:
        last = None
        while True:
            job.refresh_from_db()
            progress = job_progress(job=job)
            line = f"  {progress['finished']}/{progress['total']} rollouts finished"
            if line != last:
                self.stdout.write(line)
                last = line
            if job.status not in (RolloutJob.Status.QUEUED, RolloutJob.Status.RUNNING):
                return
            time.sleep(1)

    def _summary(self, job: RolloutJob, seconds: float) -> None:
        rollouts = job.rollouts.all()
        succeeded = rollouts.filter(status=Rollout.Status.SUCCEEDED).count()
        infra = rollouts.filter(status=Rollout.Status.INFRA_ERROR).count()
        steps = rollouts.aggregate(n=Sum("trajectory__n_steps"))["n"] or 0
        self.stdout.write(self.style.SUCCESS(
            f"Job {job.pk}: {rollouts.count()} rollouts, {succeeded} succeeded, {infra} infra errors, "
            f"{steps} steps recorded, wall time {seconds:.1f} s"))
        resolved = resolve(job.harness)
        if resolved is not None:
            preset, version = resolved
            self.stdout.write(f"Harness {preset.title} ({preset.name}) version {version}, speaking the "
                              f"{PROTOCOL_NAMES[preset.protocol]} protocol to the proxy; model {job.model_name} "
                              f"at endpoint {job.endpoint.name} ({job.endpoint.protocol})")


PROTOCOL_NAMES = {"chat": "OpenAI Chat Completions", "responses": "OpenAI Responses",
                  "messages": "Anthropic Messages", "gemini": "Gemini API"}
HARNESS_FLEET = "local-demo-harness"


def _harness_fleet():
    """A fleet for real harnesses: proxy-only network (the model through the proxy and nothing else), and the
    memory and processes a native CLI agent needs (the built-in loop's fleet is smaller and offline)."""
    from webapp.fleets import services as fleet_services
    from webapp.fleets.models import EnvironmentTemplate, Fleet

    fleet = Fleet.objects.filter(name=HARNESS_FLEET).first()
    if fleet:
        return fleet
    template = EnvironmentTemplate.objects.filter(name=HARNESS_FLEET).order_by("-version").first()
    if template is None:
        template = fleet_services.template_create(name=HARNESS_FLEET, cpu=1.0, memory_mb=2048, pids=1024,
                                                  network="proxy-only", max_lifetime_s=3600, idle_timeout_s=900)
    return fleet_services.fleet_create(name=HARNESS_FLEET, template=template, backend="local", min_warm=2,
                                       max_warm=8, max_total=16)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class _signals_held:
    """Ignore SIGINT and SIGTERM while the sandboxes are destroyed; restore the handlers afterwards."""

    def __enter__(self):
        self.saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
