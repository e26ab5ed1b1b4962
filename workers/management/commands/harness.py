"""`manage.py harness list` and `manage.py harness install NAME[@VERSION] ...`: the harness catalogue and its
bundles (workers/harness/presets/). Bundles go to TROVE_HARNESS_DIR, once per version, shared by every
checkout and CI run on the host; local sandboxes see them read-only at /opt/trove/bundles."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers.harness.presets import CATALOGUE, UnknownHarness, resolve
from workers.harness.presets.bundles import InstallFailed, bundle_manifest, harness_install


class Command(BaseCommand):
    help = "List the harness presets, or install their bundles (NAME or NAME@VERSION; `all` for every preset)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every preset: package, pinned version, protocol, installed or not")
        install = sub.add_parser("install", help="install bundles from their registries (progress shown)")
        install.add_argument("names", nargs="+", metavar="NAME[@VERSION]")
        install.add_argument("--quiet", action="store_true", help="only the outcome, not the installer's output")

    def handle(self, *args, **options):
        if options["action"] == "list":
            return self._list()
        names = list(CATALOGUE) if options["names"] == ["all"] else options["names"]
        for name in names:
            self._install(name, quiet=options["quiet"])

    def _list(self) -> None:
        root = settings.TROVE_HARNESS_DIR
        self.stdout.write(f"harness bundles in {root}")
        for preset in CATALOGUE.values():
            manifest = bundle_manifest(root, preset, preset.package.version)
            state = "installed" if manifest else "not installed"
            self.stdout.write(f"  {preset.name:<16} {preset.package.registry}:{preset.package.spec():<36} "
                              f"{preset.protocol:<10} {state}")

    def _install(self, name: str, *, quiet: bool) -> None:
        try:
            resolved = resolve(name)
        except UnknownHarness as error:
            raise CommandError(str(error)) from error
        if resolved is None:
            raise CommandError(f"{name!r} is built in: nothing to install")
        preset, version = resolved
        self.stdout.write(f"installing {preset.name}@{version} ({preset.package.registry} {preset.package.spec(version)}) "
                          f"into {settings.TROVE_HARNESS_DIR}")
        try:
            harness_install(preset=preset, version=version, root=settings.TROVE_HARNESS_DIR,
                            progress=(lambda line: None) if quiet else self.stdout.write)
        except InstallFailed as error:
            raise CommandError(f"{preset.name}@{version}: {error}") from error
        manifest = bundle_manifest(settings.TROVE_HARNESS_DIR, preset, version) or {}
        self.stdout.write(self.style.SUCCESS(f"{preset.name}@{version} ready ({manifest.get('install_s', 0)} s "
                                             f"to install, {manifest.get('bytes', 0) / 1e6:.0f} MB)"))
