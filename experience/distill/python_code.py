"""What a piece of Python an agent ran does to files, read from its source without running it.

Shell-only agents edit with Python (`python3 - <<'EOF' ... path.write_text(...) EOF`, `python -c
"open('a.py', 'w').write(...)"`), and CodeAct agents (OpenHands' `run_ipython`) edit with helper
functions (`edit_file_by_replace('/repo/a.py', ...)`). `files_written(code)` finds the files such code
writes: `open(p, 'w' | 'a' | 'x' | '+')`, `p.write_text` / `p.write_bytes` / `p.open('w')`, `shutil.copy*` /
`shutil.move` / `os.rename` / `os.replace` destinations, and the editing helpers agents are given. A path
is a string literal, `Path(...)` / `os.path.join(...)` / `a / 'b'` of literals, or a name bound to one
earlier in the code (flow-insensitive: the last binding wins). Paths built at run time (f-strings,
loops) are not followed: when unsure, nothing is written.

`exercises_project(code)` says whether inline code is a reproduction: it calls a name imported from a
module outside the standard library (`from calc import divide; divide(1, 0)`). Printing a version or
listing a directory is exploration, and an edit script (`Path(...).write_text(...)`, with an `assert`
that its pattern matched once) calls only the standard library: neither is a reproduction.
"""

from __future__ import annotations

import ast
import functools
import posixpath
import re
import sys
from dataclasses import dataclass

# Helpers that edit the file named by their first argument (OpenHands agentskills, SWE-agent tools
# called from Python); `create_file` makes a new one.
_EDIT_HELPERS = {
    "edit_file_by_replace", "edit_file", "append_file", "insert_content_at_line", "replace_in_file",
    "write_file", "create_file",
}  # fmt: skip
_CREATING_HELPERS = {"create_file"}
_EDITOR_HELPERS = {"file_editor", "str_replace_editor"}  # file_editor(command=..., path=...)
_EDITOR_WRITES = {"create", "str_replace", "insert", "undo_edit", "write", "append"}
_COPIES = {"copy", "copy2", "copyfile", "move", "rename", "replace", "renames"}  # shutil / os
_WRITE_METHODS = {"write_text", "write_bytes"}
_PATH_TYPES = {"Path", "PurePath", "PosixPath", "PurePosixPath"}
_STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class PythonWrite:
    path: str
    created: bool = False


@functools.lru_cache(maxsize=2048)
def files_written(code: str) -> tuple[PythonWrite, ...]:
    """The files `code` writes, in the order its write calls appear (each once)."""
    tree = _parse(code)
    if tree is None:
        return ()
    bindings = _path_bindings(tree)
    found: dict[str, PythonWrite] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            write = _write_of(node, bindings)
            if write is not None and write.path not in found:
                found[write.path] = write
    return tuple(found.values())


@functools.lru_cache(maxsize=2048)
def exercises_project(code: str) -> bool:
    """Whether inline code calls something imported from outside the standard library."""
    tree = _parse(code)
    if tree is None:
        return False
    imported = _project_names(tree)
    if not imported:
        return False
    return any(isinstance(node, ast.Call) and _root_name(node.func) in imported for node in ast.walk(tree))


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(_without_magics(code))
    except (SyntaxError, ValueError):
        return None


_MAGIC = re.compile(r"^\s*[!%].*$", re.M)


def _without_magics(code: str) -> str:
    """IPython cells may hold `!pip install x` or `%cd /repo` lines, which are not Python."""
    return _MAGIC.sub("pass", code) if "!" in code or "%" in code else code


def _path_bindings(tree: ast.Module) -> dict[str, str]:
    bindings: dict[str, str] = {}
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets, value = [node.optional_vars], node.context_expr
        if value is None:
            continue
        path = _literal_path(value, bindings)
        for target in targets:
            if isinstance(target, ast.Name) and path is not None:
                bindings[target.id] = path
    return bindings


def _literal_path(node: ast.expr, bindings: dict[str, str]) -> str | None:
    """The path an expression names, when it is built from literals only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if _plausible_path(node.value) else None
    if isinstance(node, ast.Name):
        return bindings.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _literal_path(node.left, bindings), _literal_path(node.right, bindings)
        return posixpath.join(left, right) if left is not None and right is not None else None
    if isinstance(node, ast.Call):
        name = _call_name(node.func)
        if name in _PATH_TYPES or name == "join":  # Path('a', 'b'), os.path.join('a', 'b')
            parts = [_literal_path(arg, bindings) for arg in node.args]
            if parts and all(part is not None for part in parts):
                return posixpath.join(*[part for part in parts if part is not None])
        if name == "open":  # `with open(p, 'w') as f`: f is the file, not a path
            return None
    return None


def _plausible_path(text: str) -> bool:
    return bool(text) and len(text) < 400 and "\n" not in text and not text.isspace()


def _write_of(call: ast.Call, bindings: dict[str, str]) -> PythonWrite | None:
    name = _call_name(call.func)
    if name == "open":
        return _open_write(call, bindings)
    if isinstance(call.func, ast.Attribute) and name in _WRITE_METHODS:
        path = _literal_path(call.func.value, bindings)
        return PythonWrite(path) if path else None
    if name in _COPIES and _module_of(call.func) in ("shutil", "os") and len(call.args) >= 2:
        path = _literal_path(call.args[1], bindings)
        return PythonWrite(path) if path else None
    if name in _EDIT_HELPERS:
        path = _first_path_argument(call, bindings, ("file_name", "path", "file_path", "filename"))
        return PythonWrite(path, created=name in _CREATING_HELPERS) if path else None
    if name in _EDITOR_HELPERS:
        return _editor_write(call, bindings)
    return None


def _open_write(call: ast.Call, bindings: dict[str, str]) -> PythonWrite | None:
    if isinstance(call.func, ast.Attribute) and _call_name(call.func) == "open" and not _is_module(call.func):
        target: ast.expr | None = call.func.value  # Path(...).open('w')
        mode_node = call.args[0] if call.args else _keyword(call, "mode")
    else:
        target = call.args[0] if call.args else _keyword(call, "file")
        mode_node = call.args[1] if len(call.args) > 1 else _keyword(call, "mode")
    mode = (
        mode_node.value if isinstance(mode_node, ast.Constant) and isinstance(mode_node.value, str) else "r"
    )
    if not any(flag in mode for flag in "wax+"):
        return None
    path = _literal_path(target, bindings) if target is not None else None
    return PythonWrite(path, created="x" in mode) if path else None


def _editor_write(call: ast.Call, bindings: dict[str, str]) -> PythonWrite | None:
    """file_editor(command='create', path='/a.py') or file_editor(**{'command': ..., 'path': ...})."""
    fields: dict[str, ast.expr] = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    for kw in call.keywords:
        if kw.arg is None and isinstance(kw.value, ast.Dict):
            for key, value in zip(kw.value.keys, kw.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    fields[key.value] = value
    command = fields.get("command")
    if not (isinstance(command, ast.Constant) and command.value in _EDITOR_WRITES):
        return None
    path = _literal_path(fields["path"], bindings) if "path" in fields else None
    return PythonWrite(path, created=command.value == "create") if path else None


def _first_path_argument(call: ast.Call, bindings: dict[str, str], names: tuple[str, ...]) -> str | None:
    node = (
        call.args[0]
        if call.args
        else next((_keyword(call, name) for name in names if _keyword(call, name)), None)
    )
    return _literal_path(node, bindings) if node is not None else None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _module_of(func: ast.expr) -> str | None:
    """`shutil` of `shutil.copy`, `os` of `os.replace`; None for a bare name."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id
    return None


def _is_module(func: ast.Attribute) -> bool:
    """`io.open` / `codecs.open` take a path first, like the builtin."""
    return _module_of(func) in ("io", "codecs", "os")


def _project_names(tree: ast.Module) -> set[str]:
    """Names bound by imports of modules outside the standard library."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in _STDLIB:
                names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # from .mod import f: the project's own
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in _STDLIB:
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _root_name(func: ast.expr) -> str | None:
    """`divide` of `divide(...)`, `calc` of `calc.ops.divide(...)`."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None
