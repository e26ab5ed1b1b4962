"""What `make demo` installs before it runs, and how long that takes from a fresh clone (README's figures).

    python3 benchmarks/demo_install.py                 # this checkout, cold then warm
    python3 benchmarks/demo_install.py --checkout /path/to/trove --keep

Clones the checkout into a scratch directory and runs the install step of `make demo` there
(`make .venv/.demo-<hash>`: a virtualenv with Trove's runtime dependencies only), twice:
- **cold**: pip's cache an empty directory of its own, so every wheel is downloaded;
- **warm**: the virtualenv removed, the same pip cache kept (every wheel already on disk).
Then the **floor** for the warm install: copying the installed virtualenv's files (`cp -a`), which is the
least any install of the same files onto the same disk must do. Reports the virtualenv's size, the two times,
the floor and warm / floor, with the load average at each start and end; JSON on the last line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def demo_stamp(clone: Path) -> str:
    """The Makefile's stamp for the demo's install: `.venv/.demo-` and the first 12 hex of pyproject's sha1."""
    digest = hashlib.sha1((clone / "pyproject.toml").read_bytes()).hexdigest()[:12]
    return f".venv/.demo-{digest}"


def directory_bytes(root: Path) -> int:
    """Bytes of the regular files below `root`, links not followed (as `du --apparent-size` counts them)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def load() -> float:
    return round(os.getloadavg()[0], 2)


def timed(argv: list[str], *, cwd: Path, env: dict[str, str]) -> dict:
    start_load, start = load(), time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"seconds": round(seconds, 1), "load": [start_load, load()]}


def measure(checkout: Path, scratch: Path) -> dict:
    clone, cache = scratch / "trove", scratch / "pip-cache"
    subprocess.run(["git", "clone", "--quiet", str(checkout), str(clone)], check=True)
    cache.mkdir()
    env = {**os.environ, "PIP_CACHE_DIR": str(cache)}
    install = ["make", "--no-print-directory", demo_stamp(clone)]

    cold = timed(install, cwd=clone, env=env)
    venv_bytes = directory_bytes(clone / ".venv")
    copy = timed(["cp", "-a", str(clone / ".venv"), str(scratch / "venv-copy")], cwd=scratch, env=env)
    shutil.rmtree(clone / ".venv")
    warm = timed(install, cwd=clone, env=env)
    return {"venv_mb": round(venv_bytes / 2**20), "cold": cold, "warm": warm, "floor_copy": copy,
            "warm_vs_floor": round(warm["seconds"] / max(copy["seconds"], 0.1), 1)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=REPO, help="the git checkout to clone (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (its path is printed)")
    options = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="trove-demo-install-"))
    try:
        figures = measure(options.checkout, scratch)
    finally:
        if options.keep:
            print(f"kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"make demo's install: {figures['venv_mb']} MB in .venv; cold {figures['cold']['seconds']} s, warm "
          f"{figures['warm']['seconds']} s; floor (copying the same files) {figures['floor_copy']['seconds']} s")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
