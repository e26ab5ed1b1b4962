"""The scripted policy behind the demo model: it works a demo task like a coding agent.

A stand-in for a real model, not a language model. Given the conversation so far it picks the next single
shell command: look around, reproduce, edit, re-run the tests, submit. Sometimes it goes wrong the way
agents do: it applies a plausible wrong edit (a decoy) and submits anyway, gives up early, or keeps
exploring until the step budget ends. How often depends on the task's difficulty.

Statelessness: each request replays the whole episode. The episode is a generator seeded from the first
user message and the request's seed; the assistant turns so far tell how far it has got, and the messages
after each assistant turn (observations) are sent back into it. So a rerun of the same conversation with
the same seed gives the same reply, and different seeds give different runs.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from workers.demo.tasks import DemoTask, Edit, match_demo_task, revert
from workers.harness.builtin import FINISH_MARKER

# Strategy weights per difficulty: solve, decoy then recover, decoy then submit, give up, wander.
_STRATEGIES = ("solve", "decoy_recover", "decoy_submit", "give_up", "wander")
_WEIGHTS = {
    "easy": (0.72, 0.08, 0.08, 0.04, 0.08),
    "medium": (0.50, 0.12, 0.18, 0.08, 0.12),
    "hard": (0.25, 0.12, 0.30, 0.13, 0.20),
}
# mini-swe-agent and its relatives end a run with this echo instead of a marker line.
_MINI_SWE_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass(frozen=True)
class Action:
    kind: str  # explore | reproduce | edit | test | submit
    thought: str
    command: str = ""
    path: str = ""  # the file an explore action reads (a read tool can do it instead of the command)
    edit: Edit | None = None  # the one replacement an edit action makes (an edit tool can do it instead)


Episode = Generator[Action, str, None]


def next_reply(messages: list[dict[str, Any]], *, seed: int | str | None = None) -> str:
    """The assistant's next reply to `messages` (OpenAI chat format), as text with a ```bash block."""
    action, mini_swe = next_action(messages, seed=seed)
    return render(action, mini_swe=mini_swe)


def next_action(messages: list[dict[str, Any]], *, seed: int | str | None = None,
                strategy: str | None = None) -> tuple[Action, bool]:
    """The next action for `messages` (OpenAI chat format: tool results are `tool` messages) and whether
    the prompt is mini-swe-agent's (it submits by echoing its marker). `strategy` (one of _STRATEGIES), when
    given, replaces the seeded draw: a test that needs a solve whatever seed a harness sends (Codex's and
    Claude Code's are per session, random) asks for one."""
    if strategy is not None and strategy not in _STRATEGIES:
        raise ValueError(f"unknown demo strategy {strategy!r}; one of {', '.join(_STRATEGIES)}")
    system, first_user, observations = _read_conversation(messages)
    task = match_demo_task(first_user) or match_demo_task(system)
    rng = random.Random(_seed_bytes(first_user, seed))
    episode = _episode(task, rng, strategy) if task is not None else _unknown_task_episode()
    action = next(episode)
    for observation in observations:
        action = episode.send(observation)
    return action, _MINI_SWE_SUBMIT in system or _MINI_SWE_SUBMIT in first_user


@dataclass(frozen=True)
class Tool:
    """A tool a request offers, whatever the protocol: its name and JSON-schema parameters."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """What the model says next when tools are offered: some text, and a tool call or none (the end)."""

    text: str
    tool_call: ToolCall | None


# Shell-like tools by the names harnesses give them (mini-swe-agent, Codex, Claude Code, gemini-cli /
# qwen-code, Codex's older one, OpenHands), in order of preference.
SHELL_TOOL_NAMES = ("bash", "exec_command", "Bash", "run_shell_command", "shell", "terminal", "execute_bash")


def next_turn(
    messages: list[dict[str, Any]], tools: list[Tool], *, seed: int | str | None = None, strategy: str | None = None
) -> Turn:
    """The next turn with tools: a command goes to the request's shell-like tool (a file read or an edit to
    its file tools, when it offers a read and an edit tool and names its working directory); the end is plain text
    (what Codex, Claude Code and opencode take as the final answer), except for mini-swe-agent, whose run
    ends on a command that prints its marker. Without a shell-like tool it answers in text, as `next_reply`."""
    action, mini_swe = next_action(messages, seed=seed, strategy=strategy)
    tool = shell_tool(tools)
    if tool is None:
        return Turn(render(action, mini_swe=mini_swe), None)
    file_call = _file_tool_call(action, tools, messages)
    if file_call is not None:
        return Turn(action.thought, file_call)
    if action.kind == "submit":
        if not mini_swe:
            return Turn(action.thought, None)
        return Turn(action.thought, ToolCall(tool.name, shell_arguments(tool, f"echo {_MINI_SWE_SUBMIT}", action.thought)))
    return Turn(action.thought, ToolCall(tool.name, shell_arguments(tool, action.command, action.thought)))


# File tools by harness: Claude Code (Read / Edit), opencode (read / edit), gemini-cli and qwen-code
# (read_file / replace). Each wants an absolute path, and Claude Code and opencode refuse to edit a file the
# session has not read through their read tool, so the two are used together or not at all.
_READ_TOOLS = ("Read", "read", "read_file")
_EDIT_TOOLS = ("Edit", "edit", "replace")
_PATH_KEYS = ("file_path", "filePath", "absolute_path", "path")
_OLD_NEW_KEYS = (("old_string", "new_string"), ("oldString", "newString"))
_WORKDIR = re.compile(r"(?:Working directory|working in the directory|<cwd>)[:\s]*(/[^\s<>'\"`]+)", re.IGNORECASE)


def _file_tool_call(action: Action, tools: list[Tool], messages: list[dict[str, Any]]) -> ToolCall | None:
    """A read or edit through the request's file tools, when it has both and says its working directory
    (their paths are absolute); None to use the shell tool instead."""
    if not (action.path and action.kind == "explore") and action.edit is None:
        return None
    by_name = {tool.name: tool for tool in tools}
    read = next((by_name[n] for n in _READ_TOOLS if n in by_name), None)
    edit = next((by_name[n] for n in _EDIT_TOOLS if n in by_name), None)
    system, first_user, _ = _read_conversation(messages)
    workdir = _WORKDIR.search(system + "\n" + first_user)
    if read is None or edit is None or workdir is None:
        return None
    read_key = next((k for k in _PATH_KEYS if k in _properties(read)), None)
    edit_key = next((k for k in _PATH_KEYS if k in _properties(edit)), None)
    old_new = next((pair for pair in _OLD_NEW_KEYS if set(pair) <= set(_properties(edit))), None)
    if read_key is None or edit_key is None or old_new is None:
        return None
    root = workdir.group(1).rstrip("/.")
    if action.edit is not None:
        return ToolCall(edit.name, {edit_key: f"{root}/{action.edit.path}", old_new[0]: action.edit.old,
                                    old_new[1]: action.edit.new})
    return ToolCall(read.name, {read_key: f"{root}/{action.path}"})


def shell_tool(tools: list[Tool]) -> Tool | None:
    """The request's shell-like tool: one of SHELL_TOOL_NAMES, else any tool with a `command` or `cmd`."""
    by_name = {tool.name: tool for tool in tools}
    for name in SHELL_TOOL_NAMES:
        if name in by_name:
            return by_name[name]
    return next((t for t in tools if {"command", "cmd"} & set(_properties(t))), None)


def shell_arguments(tool: Tool, command: str, thought: str) -> dict[str, Any]:
    """Arguments for `tool` that run `command`: its `command` (or `cmd`) property, as a string or, when the
    schema wants an array (Codex's `shell`), as bash -lc; required properties besides are filled in plainly."""
    properties = _properties(tool)
    key = "cmd" if "cmd" in properties and "command" not in properties else "command"
    wants_array = (properties.get(key) or {}).get("type") == "array"
    arguments: dict[str, Any] = {key: ["bash", "-lc", command] if wants_array else command}
    for name in tool.parameters.get("required") or []:
        if name not in arguments and isinstance(properties.get(name), dict):
            arguments[name] = _plain_value(name, properties[name], thought)
    return arguments


def _properties(tool: Tool) -> dict[str, Any]:
    properties = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
    return properties if isinstance(properties, dict) else {}


def _plain_value(name: str, schema: dict[str, Any], thought: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]  # e.g. OpenHands' security_risk: LOW
    kind = schema.get("type")
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return schema.get("default", 120)
    if kind == "array":
        return []
    return thought.splitlines()[0][:80] if name == "description" else ""


def render(action: Action, *, mini_swe: bool = False) -> str:
    if action.kind != "submit":
        return f"{action.thought}\n\n```bash\n{action.command}\n```"
    if mini_swe:
        return f"{action.thought}\n\n```bash\necho {_MINI_SWE_SUBMIT}\n```"
    return f"{action.thought}\n\n{FINISH_MARKER}"


def edit_command(edits: list[Edit]) -> str:
    """A python3 here-document that applies exact replacements (sed would trip on quotes and brackets).
    repr() keeps every string on one line, so no line of the script can end the here-document."""
    lines = ["python3 - <<'EOF'", "from pathlib import Path", ""]
    for e in edits:
        lines += [
            f"path = Path({e.path!r})",
            "text = path.read_text()",
            f"old = {e.old!r}",
            f"new = {e.new!r}",
            "assert text.count(old) == 1, f'expected exactly one match in {path}'",
            "path.write_text(text.replace(old, new))",
            "print('edited', path)",
            "",
        ]
    return "\n".join(lines[:-1] + ["EOF"])


def tests_passed(observation: str) -> bool:
    # "exit code: 1" (Trove's harness), "Process exited with code 1" (Codex), '"returncode": 1' (mini-swe-agent)
    code = re.search(r"(?:exit(?:[ _]code|ed with code):?\s*|\"?returncode\"?\s*[:>]\s*)(-?\d+)", observation,
                     re.IGNORECASE)
    if code:
        return int(code.group(1)) == 0
    return bool(re.search(r"^OK\b", observation, re.MULTILINE)) and "FAILED" not in observation


def _read_conversation(messages: list[dict[str, Any]]) -> tuple[str, str, list[str]]:
    """(system text, the user text before the first reply, one observation per assistant turn so far)."""
    system, first_user = "", None
    observations: list[str] = []
    for message in messages:
        role, text = message.get("role"), _text(message.get("content"))
        if role == "assistant":
            observations.append("")
        elif role in ("system", "developer") and not observations:
            system += text + "\n"
        elif observations:
            observations[-1] += text + "\n"
        elif role == "user":
            # Every user message before the first reply: Codex and Claude Code send their context
            # (environment, AGENTS.md, reminders) as user messages ahead of the prompt.
            first_user = text if first_user is None else f"{first_user}\n{text}"
    return system, first_user or "", observations


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _seed_bytes(first_user: str, seed: int | str | None) -> bytes:
    return hashlib.sha256(f"{first_user}\x00{seed if seed is not None else ''}".encode()).digest()


def _episode(task: DemoTask, rng: random.Random, forced: str | None = None) -> Episode:
    drawn = rng.choices(_STRATEGIES, weights=_WEIGHTS[task.difficulty])[0]  # drawn even when forced: the
    strategy = forced or drawn  # rest of the episode's draws stay those of its seed
    test_cmd = _test_command(task, rng)
    yield from _explore(task, rng)
    yield Action("reproduce", rng.choice(_REPRODUCE), test_cmd)
    if strategy == "give_up":
        yield from _give_up(task, rng)
    if strategy == "wander":
        yield from _wander(task, rng, test_cmd)
    edit = task.solution if strategy == "solve" else [rng.choice(task.decoys)]
    observation = yield Action("edit", _edit_thought(task, edit, rng), edit_command(edit),
                               edit=edit[0] if len(edit) == 1 else None)
    if "Traceback" in observation:  # the edit did not apply: the file is not what the script expected
        yield from _give_up(task, rng)
    observation = yield Action("test", rng.choice(_RETEST), test_cmd)
    if not tests_passed(observation) and strategy == "decoy_recover":
        fix = [revert(edit[0]), *task.solution]
        yield Action("edit", rng.choice(_RECOVER), edit_command(fix))
        observation = yield Action("test", rng.choice(_RETEST), test_cmd)
    if tests_passed(observation) and rng.random() < 0.3:
        path = task.solution[0].path
        yield Action("explore", f"Let me look over the change in {path} once more.", f"cat {path}")
    passed = tests_passed(observation)
    while True:
        yield Action("submit", rng.choice(_DONE if passed else _SUBMIT_ANYWAY))


def _explore(task: DemoTask, rng: random.Random) -> Episode:
    yield Action("explore", rng.choice(_LOOK), rng.choice(_LISTINGS))
    targets = list(dict.fromkeys(e.path for e in task.solution))
    others = [p for p in task.source_paths if p not in targets and not p.endswith("__init__.py")]
    if others and rng.random() < 0.5:
        targets.append(rng.choice(others))
    rng.shuffle(targets)
    test_path = task.test_paths[0]
    if rng.random() < 0.8:
        targets.insert(rng.randrange(len(targets) + 1), test_path)
    for path in targets:
        yield Action("explore", rng.choice(_READ).format(path=path), rng.choice(_CAT).format(path=path), path=path)
    if rng.random() < 0.35:
        symbol = _symbol(task, rng)
        yield Action("explore", f"Where is `{symbol}` used?", f"grep -rn '{symbol}' --include='*.py' .")


def _give_up(task: DemoTask, rng: random.Random) -> Episode:
    path = rng.choice(task.source_paths)
    yield Action("explore", rng.choice(_READ).format(path=path), f"cat -n {path}", path=path)
    while True:
        yield Action("submit", rng.choice(_GIVE_UP))


# A wandering episode gives up after this many actions. The built-in harness's step budget (20 by default) ends
# it first; an external harness has no budget of its own, and Codex or opencode would otherwise wander until
# the rollout's wall time (hundreds of calls: slow jobs, and tests that hang).
WANDER_ACTIONS = 40


def _wander(task: DemoTask, rng: random.Random, test_cmd: str) -> Episode:
    """Keep looking around without ever committing to an edit, until the step budget ends the run or, after
    `WANDER_ACTIONS`, give up unsolved."""
    for _ in range(WANDER_ACTIONS):
        roll = rng.random()
        path = rng.choice(sorted(task.files))
        if roll < 0.45:
            yield Action("explore", rng.choice(_READ).format(path=path), rng.choice(_CAT).format(path=path),
                         path=path)
        elif roll < 0.65:
            symbol = _symbol(task, rng)
            yield Action("explore", f"Let me check how `{symbol}` is used.", f"grep -rn '{symbol}' .")
        elif roll < 0.8:
            yield Action("explore", "Let me look at the layout again.", rng.choice(_LISTINGS))
        else:
            yield Action("reproduce", "Let me run the tests again to look at the failure.", test_cmd)
    while True:
        yield Action("submit", rng.choice(_GIVE_UP))


def _unknown_task_episode() -> Episode:
    yield Action("explore", "Let me look at the repository first.", "ls -la")
    while True:
        yield Action(
            "submit",
            "I am the Trove demo stand-in model: a scripted policy that only knows Trove's built-in demo tasks, "
            "and this task is not one of them. Stopping without changes.",
        )


def _test_command(task: DemoTask, rng: random.Random) -> str:
    # The visible tests: the hidden ones are not in the workspace until the evaluation.
    if " -q " in task.test_command and rng.random() < 0.5:
        return task.test_command.replace(" -q ", " -v ")
    return task.test_command


def _symbol(task: DemoTask, rng: random.Random) -> str:
    names = re.findall(r"^\s*def ([a-z]\w*)", task.files[task.solution[0].path], re.MULTILINE)
    return rng.choice(names) if names else task.key


def _edit_thought(task: DemoTask, edits: list[Edit], rng: random.Random) -> str:
    first = edits[0].old.strip().splitlines()[0].strip()
    return rng.choice(_EDIT).format(path=edits[0].path, line=first)


_LISTINGS = ["ls -R", "find . -type f -name '*.py' | sort", "ls -la && ls -la tests"]
_CAT = ["cat {path}", "cat -n {path}", "sed -n '1,200p' {path}"]
_LOOK = [
    "Let me start by looking at the repository layout.",
    "First, I'll see which files are in the repository.",
    "I'll get an overview of the project structure.",
]
_READ = ["Let me read {path}.", "Now I'll look at {path}.", "Let me check {path}."]
_REPRODUCE = [
    "Let me run the tests to reproduce the failure.",
    "I'll run the test suite to see what fails.",
    "Before changing anything, let me reproduce the problem with the tests.",
]
_EDIT = [
    "I see the problem in {path}: `{line}` is wrong. Let me fix it.",
    "The bug is in {path} around `{line}`. I'll change that.",
    "Found it: `{line}` in {path} causes the issue. Editing it now.",
]
_RETEST = ["Now let me re-run the tests.", "Let me check that the tests pass now.", "Re-running the tests."]
_RECOVER = [
    "That edit did not fix it. Let me revert it and fix the actual cause.",
    "The tests still fail, so my change was wrong. Reverting it and trying a different fix.",
]
_DONE = [
    "All tests pass now. The fix is complete.",
    "The tests pass. I'm done.",
    "The issue is fixed and the test suite passes.",
]
_SUBMIT_ANYWAY = [
    "The remaining failures look unrelated to the issue. Submitting my change.",
    "I believe my change addresses the issue; the leftover test failure seems to be a test problem.",
]
_GIVE_UP = [
    "I could not find the cause of the failure with confidence, so I'll stop here without a change.",
    "I'm not able to work out the right fix. Giving up.",
]
