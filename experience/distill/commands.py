"""What an action meant: the files it wrote, the tests it ran and whether they passed.

Agents act through shell commands (`pytest -x tests/test_a.py`, `sed -i ... src/a.py`, `cat > a.py <<EOF`,
`tee`, `mv`, and Python that writes files: `python3 - <<'EOF' ... path.write_text(...)`, `python -c
"open(...)"`), through SWE-agent's interface (`open`, `create`, `edit 4:4`, `str_replace_editor ...`) and
through structured tool calls (`str_replace_editor`, `file_editor`, `bash`, `write` / `edit` tools,
OpenHands' `run_ipython` with its editing helpers, a harness's own `run_tests`). This module reads intent
from that text alone; `rubric` adds what only the run's history knows (which file is open, which files the
run created, what the output said).

Everything here is a heuristic over recorded text, tuned to be conservative: when unsure, a command is not
a test run and not an edit.
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from experience.distill import python_code, shell

PATCH = "<patch>"  # a write whose files are inside a patch (`git apply`, `patch`): paths unknown

_TEST_DIRS = {"test", "tests", "testing", "__tests__", "spec", "specs"}
_TEST_NAME = re.compile(r"^(test_.+|.+_tests?\.\w+|conftest\.py|tests?\.py|.+\.(test|spec)\.\w+)$", re.I)
_REPRO_NAME = re.compile(r"repro|reproduc|debug_|scratch|^tmp_|^temp_|^try_|^verify_", re.I)
_DOC_EXTENSIONS = {".md", ".rst", ".txt", ".adoc"}
_DOC_NAMES = {"changelog", "changes", "authors", "history", "news", "license", "readme"}
# Redirect targets that are files an agent edits, not logs or scratch output.
_CODE_EXTENSIONS = {
    ".py", ".pyi", ".js", ".jsx", ".ts", ".tsx", ".go", ".rs", ".java", ".kt", ".c", ".h", ".cc", ".cpp",
    ".hpp", ".rb", ".php", ".cs", ".swift", ".scala", ".sh", ".pl", ".lua", ".toml", ".cfg", ".ini",
    ".yaml", ".yml", ".json",
}  # fmt: skip

ROLES = ("test", "repro", "source", "other", "scratch")  # scratch: see rubric._classified


@functools.lru_cache(maxsize=16384)
def path_role(path: str) -> str:
    """The role of a file from its path alone (cached: runs write and run the same files again).

    - `test`: under a test directory (test, tests, testing, __tests__, spec) or named like a test
      (test_*.py, *_test.go, conftest.py, *.spec.ts, ...);
    - `repro`: named like a reproduction or scratch script (repro*, reproduce*, debug_*, scratch*, tmp_*);
    - `other`: documentation (.md, .rst, .txt, CHANGELOG, AUTHORS...);
    - `source`: everything else, including a patch whose files are unknown.
    """
    if path == PATCH:
        return "source"
    name = posixpath.basename(path)
    directories = {part.lower() for part in posixpath.dirname(path).split("/")}
    if directories & _TEST_DIRS or _TEST_NAME.match(name):
        return "test"
    if _REPRO_NAME.search(name):
        return "repro"
    stem, extension = posixpath.splitext(name)
    if extension.lower() in _DOC_EXTENSIONS or stem.lower() in _DOC_NAMES:
        return "other"
    return "source"


def named_like_test(name: str) -> bool:
    """Whether a file's name (not its directory) says it is a test: test_*.py, *_test.go, conftest.py..."""
    return _TEST_NAME.match(name) is not None


_WORD = re.compile(r"[\w./-]+")


def files_named_in(text: str) -> frozenset[str]:
    """Basenames of the files a task's text names (`missing_colon.py`, "src/calc.py"): words with an
    extension."""
    names = (posixpath.basename(word.rstrip(".")) for word in _WORD.findall(text[:20000]))
    return frozenset(name for name in names if posixpath.splitext(name)[1][1:].isalnum())


def same_file(left: str, right: str) -> bool:
    """Whether two spellings name one file: equal after normalising, or one is a path suffix of the
    other ("reproduce.py" and "/repo/reproduce.py"). Runs mix relative and absolute paths freely."""
    a, b = _normalise(left), _normalise(right)
    if a == b:
        return True
    shorter, longer = sorted((a, b), key=len)
    return longer.endswith("/" + shorter.lstrip("/"))


@functools.lru_cache(maxsize=16384)
def _normalise(path: str) -> str:
    path = path.strip().strip("'\"")
    return posixpath.normpath(path) if path else path


@dataclass(frozen=True)
class FileWrite:
    """A file the action writes; `created` when the action makes a new file (`create`, editor `create`)."""

    path: str
    created: bool = False


@dataclass(frozen=True)
class TestInvocation:
    """A test run the action starts.

    `runner` names the tool (`pytest`, `unittest`, `django`, `tox`, `go`, ..., `tool` for a harness's own
    test tool, `script` for a file run directly with an interpreter, whose path is `script`, or `inline`
    for inline Python that exercises the project: `python -c "from calc import f; f(1)"`). `wide` means
    the whole suite (or a whole test directory), not chosen files or a `-k` selection.
    """

    runner: str
    wide: bool
    script: str | None = None


@dataclass(frozen=True)
class CommandIntent:
    """What one action tries to do, read from its text. `edits_open_file` is an interface edit of
    whatever file is open (SWE-agent `edit`); `opens` is the file it opens; `piped` means the exit code
    belongs to the last command of a pipe and says nothing about the test run; `editor` marks interface
    and editor-tool writes, whose output says when an edit was refused (shell writes are taken as done)."""

    writes: tuple[FileWrite, ...] = ()
    tests: tuple[TestInvocation, ...] = ()
    opens: str | None = None
    edits_open_file: bool = False
    piped: bool = False
    editor: bool = False  # an editor command: it reports a refused edit in its output


NO_INTENT = CommandIntent()

# SWE-agent interface commands that change or open files; the rest (find_file, goto, scroll...) only read.
_ACI_EDITS = {"edit", "insert", "append"}
_EDITOR_WRITES = {"create", "str_replace", "insert", "undo_edit", "write", "overwrite", "append"}
_EDITOR_TOOLS = {
    "str_replace_editor",
    "str_replace_based_edit_tool",
    "file_editor",
    "text_editor",
    "edit_file",
}
_SHELL_TOOLS = {"bash", "execute_bash", "shell", "run", "run_command", "terminal", "execute_command", "exec"}
_WRITE_TOOLS = {"write_file", "create_file", "write", "write_to_file", "edit", "multiedit", "multi_edit"}
_PATCH_TOOLS = {"apply_patch", "patch"}
_PYTHON_TOOLS = {"run_ipython", "ipython", "execute_ipython_cell", "python", "run_python"}
_TEST_TOOLS = {"run_tests", "run_test", "test", "tests", "pytest"}
# Arguments of a test tool that narrow it to some tests (anything else runs the suite).
_TEST_TOOL_SELECTIONS = (
    "path",
    "paths",
    "file",
    "files",
    "test",
    "tests",
    "test_name",
    "k",
    "pattern",
    "selector",
)


@functools.lru_cache(maxsize=8192)
def parse_command(command: str) -> CommandIntent:
    """Intent of one command string: an interface command or a shell command line.

    Cached: runs repeat their commands (every build reads each run's twice, and agents rerun the same
    tests), shlex is slow, and the intent is immutable."""
    first_line = command.strip().split("\n", 1)[0]
    head = shell.split_words(first_line)
    if not head:
        return NO_INTENT
    aci = _aci_intent(head)
    if aci is not None:
        return aci
    return _shell_intent(command)


def parse_tool_call(name: str, arguments: Mapping[str, Any] | str | None) -> CommandIntent:
    """Intent of one structured tool call (OpenAI function name and arguments)."""
    args = _tool_arguments(arguments)
    name = name.lower()
    command = args.get("command") if isinstance(args.get("command"), str) else args.get("cmd")
    path = args.get("path") or args.get("file_path") or args.get("filename") or args.get("file")
    if name in _EDITOR_TOOLS:
        return _editor_intent(str(command or ""), str(path) if path else None)
    if name in _SHELL_TOOLS and isinstance(command, str):
        return parse_command(command)
    if name in _WRITE_TOOLS and path:
        return CommandIntent(writes=(FileWrite(str(path), created="create" in name),), editor=True)
    if name in _PATCH_TOOLS:
        return CommandIntent(writes=(FileWrite(PATCH),), editor=True)
    if name in _PYTHON_TOOLS and isinstance(args.get("code"), str):
        return _python_intent(args["code"], editor=True)  # its helpers report a refused edit
    if name in _TEST_TOOLS:
        selected = any(args.get(key) for key in _TEST_TOOL_SELECTIONS)
        return CommandIntent(tests=(TestInvocation("tool", wide=not selected),))
    if name in {"open", "create"} | _ACI_EDITS:
        words = [name] + ([str(path)] if path else [])
        return _aci_intent(words) or NO_INTENT
    return NO_INTENT


def tool_call_name_and_arguments(call: Mapping[str, Any]) -> tuple[str, Any]:
    """(name, arguments) of an OpenAI-style tool call, or of a flat {"name", "arguments"} one."""
    function = call.get("function")
    if isinstance(function, Mapping):
        return str(function.get("name") or ""), function.get("arguments")
    return str(call.get("name") or ""), call.get("arguments") or call.get("input")


def _tool_arguments(arguments: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    if isinstance(arguments, Mapping):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _aci_intent(words: list[str]) -> CommandIntent | None:
    verb = words[0]
    target = words[1] if len(words) > 1 else None
    if verb == "create" and target:
        return CommandIntent(writes=(FileWrite(target, created=True),), opens=target, editor=True)
    if verb == "open" and target:
        return CommandIntent(opens=target)
    if verb in _ACI_EDITS:
        return CommandIntent(edits_open_file=True, editor=True)
    if verb in _EDITOR_TOOLS:
        return _editor_intent(target or "", words[2] if len(words) > 2 else None)
    return None


def _editor_intent(subcommand: str, path: str | None) -> CommandIntent:
    if not path or subcommand not in _EDITOR_WRITES:
        return NO_INTENT
    return CommandIntent(writes=(FileWrite(path, created=subcommand == "create"),), editor=True)


# --- shell ---------------------------------------------------------------------------------------------

_CONTROL = {"&&", "||", ";", "|", "&", "|&", ";;"}
_WRITE_REDIRECTS = {">", ">>", ">|", "&>", "&>>"}
_OTHER_REDIRECTS = {"<", "<<", "<<<", ">&", "<&", "<<-"}
_SHELLS = {"bash", "sh", "zsh"}
_PREFIXES = {"sudo", "time", "nohup", "env", "command", "exec", "xvfb-run"}
_HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)([A-Za-z_][\w-]*)\1")


def _shell_intent(command: str) -> CommandIntent:
    text, bodies = _take_heredocs(command)
    tokens = shell.split_words(_newlines_to_semicolons(text))
    writes: list[FileWrite] = []
    tests: list[TestInvocation] = []
    piped = "|" in tokens or "|&" in tokens
    for segment in _segments(tokens):
        inner = _segment_intent(segment, bodies)
        writes.extend(inner.writes)
        tests.extend(inner.tests)
        piped = piped or inner.piped
    return CommandIntent(writes=tuple(writes), tests=tuple(tests), piped=piped)


_HEREDOC_MARKER = "TROVE_HEREDOC_"  # stands for a heredoc's body in the command line


def _take_heredocs(command: str) -> tuple[str, list[str]]:
    """The command without its heredoc bodies (their text is file content or a script's source, not
    commands), each heredoc's delimiter replaced by a marker naming its body in the returned list, so
    the command that reads it (`python3 - <<'EOF'`, `cat > a.py <<EOF`) can be told what it read."""
    if "<<" not in command:
        return command, []  # no heredoc starts (the usual command): nothing to take
    kept: list[str] = []
    bodies: list[str] = []
    body: list[str] | None = None
    delimiter: str | None = None
    for line in command.split("\n"):
        if delimiter is not None and body is not None:
            if line.strip() == delimiter:
                bodies.append("\n".join(body))
                delimiter, body = None, None
            else:
                body.append(line)
            continue
        match = _HEREDOC.search(line)
        if match:
            delimiter, body = match.group(2), []
            line = f"{line[: match.start()]}<< {_HEREDOC_MARKER}{len(bodies)}{line[match.end() :]}"
        kept.append(line)
    if body is not None:
        bodies.append("\n".join(body))  # a body cut off by truncation: still the script's source
    return "\n".join(kept), bodies


def _newlines_to_semicolons(text: str) -> str:
    """Newlines outside quotes separate commands; shlex would read them as spaces."""
    if "\n" not in text:
        return text  # one line (the usual command): the loop below would copy it unchanged
    out: list[str] = []
    quote: str | None = None
    escaped = False
    for char in text:
        if escaped:
            escaped = False
            out.append(" " if char == "\n" else char)  # a line continuation joins lines
            continue
        if char == "\\" and quote != "'":
            escaped = True
            out.append(char)
            continue
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "\n":
            out.append(" ; ")
            continue
        out.append(char)
    return "".join(out)


def _segments(tokens: list[str]) -> list[list[str]]:
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in _CONTROL:
            segments.append([])
        else:
            segments[-1].append(token)
    return [segment for segment in segments if segment]


def _segment_intent(segment: list[str], heredocs: list[str]) -> CommandIntent:
    args, writes, stdin = _take_redirects(segment, heredocs)
    args = _strip_prefixes(args)
    if not args:
        return CommandIntent(writes=tuple(writes))
    program = posixpath.basename(args[0])
    if program in _SHELLS and ("-c" in args[:-1] or (stdin is not None and len(args) == 1)):
        # bash -c "cd /repo && pytest", bash <<EOF ... EOF
        script = args[args.index("-c") + 1] if "-c" in args[:-1] else stdin or ""
        inner = _shell_intent(script)
        return CommandIntent(writes=tuple(writes) + inner.writes, tests=inner.tests, piped=inner.piped)
    code = _inline_python(program, args, stdin)
    if code is not None:
        inner = _python_intent(code)
        return CommandIntent(writes=tuple(writes) + inner.writes, tests=inner.tests)
    writes.extend(_program_writes(program, args))
    test = _test_invocation(program, args)
    return CommandIntent(writes=tuple(writes), tests=(test,) if test else ())


def _inline_python(program: str, args: list[str], stdin: str | None) -> str | None:
    """The source of Python run inline: `python -c CODE`, or a heredoc fed to `python` / `python -`."""
    if not _PYTHON.match(program):
        return None
    if "-c" in args[1:-1]:
        return args[args.index("-c") + 1]
    rest = [arg for arg in args[1:] if arg not in ("-", "-u", "-B", "-q")]
    return stdin if stdin is not None and not rest else None


def _python_intent(code: str, *, editor: bool = False) -> CommandIntent:
    """Files Python code writes, or else an inline reproduction when it calls the project's code (code
    that writes files is an edit script, whatever it imports)."""
    writes = tuple(FileWrite(w.path, created=w.created) for w in python_code.files_written(code))
    reproduces = not writes and python_code.exercises_project(code)
    tests = (TestInvocation("inline", wide=False),) if reproduces else ()
    return CommandIntent(writes=writes, tests=tests, editor=editor and bool(writes))


def _take_redirects(segment: list[str], heredocs: list[str]) -> tuple[list[str], list[FileWrite], str | None]:
    """The segment's words without redirections, the files its redirections write, and the heredoc
    body it reads on stdin (None when it reads none)."""
    args: list[str] = []
    writes: list[FileWrite] = []
    stdin: str | None = None
    index = 0
    while index < len(segment):
        token = segment[index]
        if token in _WRITE_REDIRECTS or token in _OTHER_REDIRECTS:
            if args and args[-1].isdigit():
                args.pop()  # the file descriptor of "2>"
            target = segment[index + 1] if index + 1 < len(segment) else ""
            if token in ("<<", "<<-") and target.startswith(_HEREDOC_MARKER):
                number = target[len(_HEREDOC_MARKER) :]
                stdin = heredocs[int(number)] if number.isdigit() and int(number) < len(heredocs) else ""
            if token in _WRITE_REDIRECTS and _looks_like_code_file(target):
                # "cat > check.py <<EOF" at the working directory's top is how shell-only agents write a
                # scratch script; deeper paths are more likely the project's own files being rewritten.
                created = token != ">>" and "/" not in target
                writes.append(FileWrite(target, created=created))
            index += 2
            continue
        args.append(token)
        index += 1
    return args, writes, stdin


def _looks_like_code_file(path: str) -> bool:
    if not path or path.startswith("/dev/"):
        return False
    return posixpath.splitext(path)[1].lower() in _CODE_EXTENSIONS


def _strip_prefixes(args: list[str]) -> list[str]:
    while args:
        head = args[0]
        if "=" in head and not head.startswith("-") and re.match(r"^[A-Za-z_]\w*=", head):
            args = args[1:]  # FOO=bar cmd
        elif head in _PREFIXES:
            args = args[1:]
        elif head == "timeout":
            args = args[1:]
            while args and (args[0].startswith("-") or args[0][:1].isdigit()):
                args = args[1:]
        elif head == "coverage" and args[1:2] == ["run"]:
            args = ["python"] + args[2:]
        else:
            return args
    return args


def _program_writes(program: str, args: list[str]) -> list[FileWrite]:
    if program == "sed" and any(arg.startswith("-i") or arg == "--in-place" for arg in args[1:]):
        return [FileWrite(path) for path in _sed_files(args[1:])]
    if program == "perl" and any(arg.startswith("-") and "i" in arg.lstrip("-") for arg in args[1:]):
        return [FileWrite(arg) for arg in args[1:] if _looks_like_code_file(arg)]
    if program == "tee":
        return [FileWrite(arg) for arg in args[1:] if not arg.startswith("-")]
    if program == "patch" or (program == "git" and args[1:2] in (["apply"], ["am"])):
        return [FileWrite(PATCH)]
    if program == "git" and args[1:2] in (["checkout"], ["restore"]):
        return [FileWrite(arg) for arg in args[2:] if _looks_like_code_file(arg)]
    if program in ("mv", "cp"):  # the destination changes; `cp a.py a.py.bak` makes no code file
        operands = _positional(args[1:])
        return [FileWrite(operands[-1])] if len(operands) >= 2 and _looks_like_code_file(operands[-1]) else []
    return []


def _sed_files(args: list[str]) -> list[str]:
    files: list[str] = []
    script_seen = False
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg in ("-e", "-f", "--expression", "--file"):
            script_seen, skip_next = True, True
        elif arg.startswith("-"):
            continue
        elif not script_seen:
            script_seen = True
        else:
            files.append(arg)
    return files


# --- test runners --------------------------------------------------------------------------------------

_PYTHON = re.compile(r"^(python(\d(\.\d+)?)?|pypy\d?)$")
_INTERPRETERS = {"node", "ruby", "perl", "bash", "sh", "zsh", "php", "deno", "bun"}
_PYTHON_VALUE_OPTIONS = {"-W", "-X", "-Q"}
_PYTEST_VALUE_OPTIONS = {
    "-k", "-m", "-p", "-c", "-o", "-n", "-W", "-r", "--maxfail", "--tb", "--deselect", "--ignore",
    "--ignore-glob", "--rootdir", "--confcutdir", "--basetemp", "--durations", "--log-level", "--cov",
    "--cov-report", "--junitxml", "--timeout", "--import-mode", "--capture", "--color", "--override-ini",
    "--ds", "--dist", "--reruns",
}  # fmt: skip
_PYTEST_SELECTORS = {"-k", "-m", "--deselect", "--lf", "--last-failed", "--sw", "--stepwise"}
_WIDE_TARGETS = {"test", "tests", "check", "test-all", "tests-all"}


def _test_invocation(program: str, args: list[str]) -> TestInvocation | None:
    if program in ("pytest", "py.test"):
        return _pytest(args[1:])
    if _PYTHON.match(program):
        return _python_invocation(args[1:])
    if program in ("tox", "nox"):
        return TestInvocation(program, wide=True)
    if program == "make" and any(arg in _WIDE_TARGETS for arg in args[1:]):
        return TestInvocation("make", wide=True)
    if program in ("npm", "yarn", "pnpm") and "test" in args[1:3]:
        return TestInvocation(program, wide=not _positional(args[args.index("test") + 1 :]))
    if program in ("jest", "mocha", "vitest") or (
        program == "npx" and args[1:2] in (["jest"], ["mocha"], ["vitest"])
    ):
        rest = args[2:] if program == "npx" else args[1:]
        return TestInvocation("js", wide=not _positional([arg for arg in rest if arg != "run"]))
    if program == "go" and args[1:2] == ["test"]:
        return TestInvocation("go", wide="./..." in args or not _positional(args[2:]))
    if program == "cargo" and args[1:2] == ["test"]:
        return TestInvocation("cargo", wide=not _positional(args[2:]))
    if program in ("mvn", "gradle", "gradlew", "ctest") and (program == "ctest" or "test" in args[1:]):
        return TestInvocation(program, wide=True)
    if program in _INTERPRETERS or program.startswith("./"):
        return _direct_script(program, args)
    if program.startswith("runtests"):
        return TestInvocation("django", wide=not _labels(args[1:]))
    return None


def _python_invocation(args: list[str]) -> TestInvocation | None:
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "-c":
            return None  # inline code: exploration as often as reproduction, so not counted
        if arg == "-m" and index + 1 < len(args):
            return _python_module(args[index + 1], args[index + 2 :])
        if arg in _PYTHON_VALUE_OPTIONS:
            index += 2
            continue
        if arg.startswith("-"):
            index += 1
            continue
        return _python_script(arg, args[index + 1 :])
    return None


def _python_module(module: str, rest: list[str]) -> TestInvocation | None:
    if module == "pytest":
        return _pytest(rest)
    if module == "unittest":
        return TestInvocation("unittest", wide="discover" in rest or not _positional(rest))
    if module in ("tox", "nox"):
        return TestInvocation(module, wide=True)
    if module == "django" and rest[:1] == ["test"]:
        return TestInvocation("django", wide=not _labels(rest[1:]))
    return None


def _python_script(script: str, rest: list[str]) -> TestInvocation:
    name = posixpath.basename(script)
    if name == "runtests.py":
        return TestInvocation("django", wide=not _labels(rest))
    if name == "manage.py" and rest[:1] == ["test"]:
        return TestInvocation("django", wide=not _labels(rest[1:]))
    return TestInvocation("script", wide=False, script=script)


def _direct_script(program: str, args: list[str]) -> TestInvocation | None:
    if program.startswith("./"):
        script: str | None = args[0]
    else:
        script = next((arg for arg in args[1:] if not arg.startswith("-")), None)
    if script is None or script.startswith("-"):
        return None
    if posixpath.basename(script).startswith("runtests"):
        return TestInvocation("django", wide=not _labels(args[args.index(script) + 1 :]))
    return TestInvocation("script", wide=False, script=script)


def _pytest(args: list[str]) -> TestInvocation:
    positional: list[str] = []
    selected = False
    index = 0
    while index < len(args):
        arg = args[index]
        option = arg.split("=", 1)[0]
        if option in _PYTEST_SELECTORS:
            selected = True
        if arg in _PYTEST_VALUE_OPTIONS:
            index += 2
            continue
        if not arg.startswith("-"):
            positional.append(arg)
        index += 1
    narrowed = selected or any(".py" in arg or "::" in arg for arg in positional)
    return TestInvocation("pytest", wide=not narrowed)


def _positional(args: list[str]) -> list[str]:
    return [arg for arg in args if not arg.startswith("-")]


def _labels(args: list[str]) -> list[str]:
    """Test labels of a Django-style runner: positional words that are not option values like "2"."""
    labels: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg in ("--settings", "--parallel", "-v", "--verbosity", "--exclude-tag", "--tag"):
            skip_next = True
        elif not arg.startswith("-") and not arg.isdigit():
            labels.append(arg)
    return labels


# --- outputs -------------------------------------------------------------------------------------------

# Failure markers, by a substring every match of theirs holds: (substring, the markers' expression, or
# None when the substring is the marker). An output fails when any marker matches.
_FAILURE_MARKER_PARTS: tuple[tuple[str, str | None], ...] = (
    ("Traceback (most recent call last)", None),
    # pytest summaries ("1 failed", "2 errors"): a number from 1 that starts a word (`\b[1-9]`, written as
    # a lookbehind after the first digit so that the expression starts with a character set, which `re`
    # skips to quickly instead of trying the expression at every position).
    (" failed", r"[1-9](?<!\w[1-9])\d* failed\b"),
    (" error", r"[1-9](?<!\w[1-9])\d* errors?\b"),
    (
        "FAIL",
        # pytest short summary and unittest "FAILED (failures=1)", a unittest test header, go test, cargo
        r"^FAILED\b|^FAIL:|^--- FAIL|test result: FAILED",
    ),
    ("ERR", r"^ERROR:|^npm ERR!"),  # a unittest test header, npm
    ("Error: ", r"^[A-Za-z_.]*Error: "),  # the last line of an uncaught Python exception
    ("Exception: ", r"^[A-Za-z_.]*Exception: "),
    ("command not found", None),
    ("No such file or directory", None),
)
# The markers as one expression (what `output_shows_failure` answers, which the tests check).
_FAILURE_MARKERS = re.compile(
    "|".join(expression or re.escape(hint) for hint, expression in _FAILURE_MARKER_PARTS), re.M
)
# Substring tests (fast C scans) rule out most outputs; a marker's expression is tried only on an output
# that holds its substring. (One expression of all the markers tries each at every position.)
_FAILURE_CHECKS = tuple(
    (hint, re.compile(expression, re.M) if expression else None) for hint, expression in _FAILURE_MARKER_PARTS
)
_EDIT_REJECTED = re.compile(
    r"Your proposed edit has introduced new syntax error|No replacement was performed|did not appear "
    r"verbatim|No exact match found|String to replace not found|<tool_use_error>|^Usage: |^No file open|"
    r"^\[?Error: |^\[?ERROR:|already exists",
    re.M,
)
_FILE_HEADER = re.compile(r"^\[File: (?P<path>.+?) \(\d+ lines total\)\]", re.M)


def output_shows_failure(output: str | None) -> bool:
    """Whether output carries a failure marker: a traceback, a failing test summary, "command not
    found", a missing file."""
    if not output:
        return False
    for hint, expression in _FAILURE_CHECKS:
        if hint in output and (expression is None or expression.search(output) is not None):
            return True
    return False


def verdict(*, output: str | None, exit_code: int | None, piped: bool) -> bool | None:
    """Whether a test run passed: True, False, or None when nothing was recorded.

    A recorded exit code decides, unless the command was piped (`pytest | tail` exits with tail's code);
    then, or with no exit code, the output decides: any failure marker fails the run.
    """
    if exit_code is not None and not piped:
        return exit_code == 0
    if output is None:
        return None
    return not output_shows_failure(output)


def edit_rejected(*, output: str | None, exit_code: int | None) -> bool:
    """Whether an edit was refused (the interface's syntax check, a str_replace that matched nothing,
    a non-zero exit code), so the file did not change."""
    if exit_code not in (None, 0):
        return True
    return bool(output) and _EDIT_REJECTED.search(output or "") is not None


def edited_file_from_output(output: str | None) -> str | None:
    """The file an interface edit reports it changed ("[File: /repo/a.py (40 lines total)]")."""
    match = _FILE_HEADER.search(output or "")
    return match["path"] if match else None
