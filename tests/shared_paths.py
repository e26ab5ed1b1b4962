"""Where the tests find the shared folder (real trajectory fixtures, the prebuilt kube-apiserver).

Relative to the checkout (`../shared`), or wherever TROVE_SHARED_DIR says; never a path of one machine.
`.ci/run` sets TROVE_SHARED_DIR when the checkout is not beside the shared folder.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DIR = Path(os.environ.get("TROVE_SHARED_DIR") or REPO.parent / "shared")
FIXTURES_DIR = SHARED_DIR / "fixtures" / "trajectories"
