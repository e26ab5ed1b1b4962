"""benchmarks/demo_install.py: the install step it times is the Makefile's own, and it sizes the virtualenv as
du's apparent size does (regular files, links not followed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import demo_install  # noqa: E402


def test_the_stamp_it_makes_is_the_makefiles_demo_install():
    stamp = demo_install.demo_stamp(REPO)
    dry_run = subprocess.run(["make", "-n", stamp], cwd=REPO, capture_output=True, text=True)
    assert dry_run.returncode == 0, dry_run.stderr  # "No rule to make target" when the name drifts
    assert "pip install" in dry_run.stdout or "touch" in dry_run.stdout


def test_the_size_counts_regular_files_once_and_no_link(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "a.so").write_bytes(b"x" * 1000)
    (tmp_path / "b.py").write_bytes(b"y" * 24)
    os.symlink(tmp_path / "lib" / "a.so", tmp_path / "link.so")
    os.symlink(tmp_path / "lib", tmp_path / "lib64")  # as a venv's lib64 -> lib

    assert demo_install.directory_bytes(tmp_path) == 1024
