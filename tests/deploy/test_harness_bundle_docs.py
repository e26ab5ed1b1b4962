"""deploy/README.md's recipe for harness bundles on Kubernetes names each preset at the version the catalogue
pins: a sandbox pod runs a preset's executable from /opt/trove/bundles/<name>/<version>/, so a recipe left at an
old pin builds images whose rollouts fail to start."""

from __future__ import annotations

import re
from pathlib import Path

from workers.harness.presets import CATALOGUE

README = Path(__file__).resolve().parents[2] / "deploy" / "README.md"


def bundle_section() -> str:
    text = README.read_text()
    start = text.index("## Harness bundles on Kubernetes")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_every_bundle_the_recipe_installs_is_at_the_catalogues_pinned_version():
    section = bundle_section()
    installed = re.findall(r"/opt/trove/bundles/([a-z-]+)/([0-9][^/\s]*)", section)
    assert installed, "the recipe installs bundles under /opt/trove/bundles/<name>/<version>"
    for name, version in installed:
        assert name in CATALOGUE, f"deploy/README.md installs {name!r}, which is no preset"
        assert version == CATALOGUE[name].package.version, f"{name}: recipe at {version}, catalogue pins {CATALOGUE[name].package.version}"
    for name, version in installed:
        package = CATALOGUE[name].package
        assert package.spec(version) in section, f"{name}: the recipe's install command names {package.spec(version)}"


def test_every_preset_is_in_the_recipe_or_named_in_it():
    section = bundle_section()
    for name in CATALOGUE:
        assert name in section, f"deploy/README.md says nothing of how to bundle {name}"
