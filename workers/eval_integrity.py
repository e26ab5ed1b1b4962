"""What a rollout's evaluation does so that nothing the policy could have changed judges it.

The policy controls everything its commands can reach inside the sandbox: the workspace, /tmp (its HOME),
processes it leaves running. The evaluation therefore trusts only the task's row and the read-only system
the sandbox was built from. Before the task's `eval_command` runs:

1. In place (the rollout's own sandbox), every process but the agent and its ancestors is stopped, then
   killed (`KILL_LEFTOVERS`): a background job that rewrites the tests while they are restored cannot win,
   because it is frozen before anything is restored. /tmp and /dev/shm are emptied. In a fresh sandbox
   (template `eval_mode = fresh-sandbox`) only the final diff comes from the policy: nothing of its ran there.
2. Each protected path of the task (`Task.protected_paths`, default `tests/`) is removed outright and the
   task's own files under it are written again from the Task row, never from the sandbox. Hidden evaluation
   files (`Task.eval_files`) are written only now, so the agent never saw them.
3. Files that Python, unittest or pytest load without being asked are removed unless the task ships them
   (then they are written back from the task): `conftest.py`, `sitecustomize.py`, `usercustomize.py` and
   every `__pycache__` / `*.pyc` anywhere in the workspace (an "unchecked-hash" pyc is used whatever the
   source says); test-runner configuration at the workspace root (`pytest.ini`, `tox.ini`, `setup.cfg`,
   `pyproject.toml`); and modules at the workspace root that shadow the standard library or the test runner
   (`unittest/`, `argparse.py`, `pytest.py`, ...: `python -m` puts the working directory first on sys.path).
4. The command runs with no bytecode writes and a PATH without any entry that is relative, writable by or
   owned by the sandbox user, or under the workspace, /tmp or /dev/shm: a planted `python3` cannot come
   first. In place it also gets a fresh empty HOME and no user site-packages (`PYTHONNOUSERSITE`): the
   policy's HOME is /tmp, where a `.pth` file would run at every interpreter start.

Not covered (documented in the threat model): the code under test itself subverting the test run from
inside the evaluation's process (calling `os._exit(0)` at import, patching unittest, reading the hidden
tests once they are written): the evaluation runs that code, as every test-based reward does. Anything the
task keeps in its workspace besides its sources (a virtualenv, vendored packages) is the policy's to edit:
install dependencies in the image or the template's setup. Services a template or task setup started in the
background die with the policy's processes in place; such templates evaluate in a fresh sandbox, where
setup runs again and nothing is killed. Files a setup command generates under a protected path are removed
with it (protect narrower paths for such a task).
"""

from __future__ import annotations

import posixpath
import shlex
import sys

from workers.sandboxes.base import ExecResult

# Kills every process in the sandbox but pid 1, the agent and this script's other ancestors. Two phases:
# stop (SIGSTOP) until a round finds no process not yet stopped — a stopped process cannot fork, so a fork
# loop is caught within rounds — then SIGKILL them all; up to three sweeps, until none is left alive.
# Builtins only in the loops (`read`, `kill`), so the script forks nothing the scan would see (and it runs in
# the exec's own shell, never a subshell, which would be a process of its own). Exits 3 when a process is
# still alive after the sweeps.
KILL_LEFTOVERS = r"""
keep=" 1 "; p=$$
while [ "$p" -gt 1 ]; do
  keep="$keep$p "
  read -r stat < "/proc/$p/stat" || break
  stat=${stat##*) }; set -- $stat; p=$2
done
# Pids of live processes this script may signal (others' uid: not the policy's), not kept, not zombies.
live() {
  found=""
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$keep" in *" $pid "*) continue ;; esac
    read -r stat < "$d/stat" 2>/dev/null || continue
    stat=${stat##*) }; case "$stat" in Z*|X*) continue ;; esac
    kill -0 "$pid" 2>/dev/null && found="$found $pid"
  done
}
killed=0
for sweep in 1 2 3; do
  stopped=" "; round=0
  while [ "$round" -lt 200 ]; do
    new=0
    for d in /proc/[0-9]*; do
      pid=${d#/proc/}
      case "$keep$stopped" in *" $pid "*) continue ;; esac
      if kill -STOP "$pid" 2>/dev/null; then stopped="$stopped$pid "; new=1; fi
    done
    [ "$new" = 0 ] && break
    round=$((round + 1))
  done
  for pid in $stopped; do kill -KILL "$pid" 2>/dev/null && killed=$((killed + 1)); done
  for wait in 1 2 3 4 5 6 7 8 9 10; do
    live; [ -z "$found" ] && break
    sleep 0.05
  done
  [ -z "$found" ] && break
done
echo "trove-eval: killed $killed process(es) left in the sandbox"
if [ -n "$found" ]; then echo "trove-eval: processes still alive after SIGKILL:$found" >&2; exit 3; fi
find /tmp /dev/shm -mindepth 1 -delete 2>/dev/null
"""

HIJACK_NAMES = ("conftest.py", "sitecustomize.py", "usercustomize.py", "__pycache__")
# Not *.pth: Python reads those only in site directories, which the workspace is not (the user site, under
# HOME in /tmp, is emptied and turned off); removing them would break an editable install's .pth in a
# virtualenv that a task keeps in its workspace (whose site-packages the policy could edit anyway).
HIJACK_PATTERNS = ("*.pyc",)
RUNNER_CONFIG = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
RUNNER_MODULES = ("pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup", "tomli",
                  "colorama", "pygments")

# The evaluation's environment, set in the same shell just before the task's command: a PATH of directories
# the sandbox user can neither write nor owns, outside the workspace and the temporary directories.
EVAL_PRELUDE = r"""
clean_path=""
IFS=:
for d in $PATH; do
  case "$d" in /*) ;; *) continue ;; esac
  case "$d/" in "$PWD"/*|/tmp/*|/dev/shm/*|/workspace/*) continue ;; esac
  if [ -w "$d" ] || [ -O "$d" ]; then continue; fi
  clean_path="${clean_path:+$clean_path:}$d"
done
unset IFS
export PATH="$clean_path"
hash -r
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONSTARTUP PYTHONINSPECT BASH_ENV ENV CDPATH
"""
# In place, HOME (under /tmp) was the policy's: a fresh empty one, and no user site-packages. A fresh sandbox's
# HOME holds only what the template's setup put there (a `pip install --user`, say), so it is kept.
IN_PLACE_PRELUDE = r"""
export HOME="$(mktemp -d)" PYTHONNOUSERSITE=1
"""


def protected_roots(task) -> list[str]:
    """Workspace paths removed before the evaluation: the protected paths and the hidden files' paths.
    Only paths inside the workspace (the importer refuses others; a row written another way is not trusted)."""
    roots = {_normal(path) for path in [*task.protected_paths, *task.eval_files]}
    return sorted(root for root in roots if root not in (".", "..") and not root.startswith(("/", "../")))


def restored_files(task) -> dict[str, str]:
    """What the evaluation writes into the workspace, from the Task row: the task's files under a protected
    path or of a name scrubbed below, then the hidden evaluation files (which win on a clash)."""
    roots = protected_roots(task)
    kept = {path: text for path, text in task.files.items()
            if _under(path, roots) or _scrubbed_name(path)}
    return {**kept, **task.eval_files}


def scrub_script(task) -> str:
    """Removes the protected roots, the hijack files anywhere outside .git, and at the workspace root the
    runner configuration and every module the task does not ship whose name is a standard-library or
    test-runner module or a protected directory's: `argparse.py`, `unittest/`, `argparse.<abi>.so` (an
    extension module is found before the stdlib's), `tests.py` (a module setting `__path__` would serve
    `tests.test_x` from anywhere while `tests/` has no `__init__.py`). Exit 4 if a removal failed."""
    roots = protected_roots(task)
    owned_top = sorted({path.split("/", 1)[0] for path in task.files})
    shadows = {name for name in {*sys.stdlib_module_names, *RUNNER_MODULES} if not name.startswith("__")}
    shadows |= {root.split("/", 1)[0] for root in roots}
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in (*HIJACK_NAMES, *HIJACK_PATTERNS))
    return "\n".join([
        "chmod u+rwx . 2>/dev/null",
        f"for p in {' '.join(shlex.quote(r) for r in roots)}; do [ -d \"$p\" ] && ! [ -L \"$p\" ] "
        "&& chmod -R u+rwX -- \"$p\" 2>/dev/null; done" if roots else ":",
        f"rm -rf -- {' '.join(shlex.quote(p) for p in [*roots, *RUNNER_CONFIG])} || exit 4",
        # An entry's module name is what precedes its first dot (`x.py`, `x.cpython-311-x86_64-linux-gnu.so`).
        f"owned=' {' '.join(owned_top)} '; shadows=' {' '.join(sorted(shadows))} '",
        "for f in * .[!.]*; do [ -e \"$f\" ] || [ -L \"$f\" ] || continue; case \"$owned\" in *\" $f \"*) continue ;; esac; "
        "case \"$shadows\" in *\" ${f%%.*} \"*) rm -rf -- \"$f\" || exit 4 ;; esac; done",
        f"find . -path ./.git -prune -o \\( {names} \\) -prune -exec rm -rf -- {{}} + || exit 4",
        "exit 0",
    ])


def prepare_command(task, *, kill: bool) -> str:
    """One exec before the files are restored: (in place) kill leftovers, then scrub the workspace."""
    script = scrub_script(task)
    return f"{KILL_LEFTOVERS}\n{script}" if kill else script


def eval_command(task, *, fresh: bool) -> str:
    return f"{EVAL_PRELUDE}{'' if fresh else IN_PLACE_PRELUDE}\n{task.eval_command}"


def transport_diff_command(task, baseline: str) -> str:
    """The final workspace diff from the `baseline` commit, without the protected paths, as a binary patch
    for `git apply`. Run with the policy's own .git: whatever it made git say is only a patch, applied to
    the task's files (a baseline object it removed fails the diff, and so the run)."""
    excludes = " ".join(shlex.quote(f":(exclude,top){root}") for root in protected_roots(task))
    return ("export GIT_CONFIG_NOSYSTEM=1; git add -A >/dev/null 2>&1; "
            f"git -c core.fsmonitor= -c diff.external= --no-pager diff --cached --binary --no-ext-diff "
            f"--no-textconv --no-color {shlex.quote(baseline)} -- . {excludes}")


def remove_hidden_command(task) -> str:
    """After the evaluation of a sandbox that goes back to the pool (a reusable template): the hidden files
    out, so the next rollout's agent cannot read this task's answer key."""
    return "rm -rf -- " + " ".join(shlex.quote(_normal(path)) for path in task.eval_files)


PATCH_PATH = ".git/trove-final.patch"
APPLY_PATCH = (f"export GIT_CONFIG_NOSYSTEM=1; test -s {PATCH_PATH} || {{ rm -f {PATCH_PATH}; exit 0; }}; "
               f"git apply --binary --whitespace=nowarn {PATCH_PATH}; status=$?; rm -f {PATCH_PATH}; exit $status")


def refused(message: str, duration_ms: float = 0.0) -> ExecResult:
    """An evaluation that could not be made trustworthy: no exit code, so it never counts as passed."""
    return ExecResult(exit_code=None, stdout="", stderr=f"trove: {message}\n", duration_ms=duration_ms)


def _normal(path: str) -> str:
    return posixpath.normpath(path.strip().rstrip("/"))


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _scrubbed_name(path: str) -> bool:
    name = posixpath.basename(path)
    if name in HIJACK_NAMES or name.endswith(".pyc") or "/__pycache__/" in f"/{path}":
        return True
    return "/" not in path and name in RUNNER_CONFIG
