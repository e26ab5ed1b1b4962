#!/usr/bin/env python3
"""mini_agent: a tiny external harness, an example of "any CLI agent" for Trove. Stdlib only.

It works like mini-swe-agent: ask the model for one bash command, run it, send back the exit code and the
output, repeat; the model ends the run by running `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. It knows
nothing about Trove: it reads the usual OpenAI environment variables, and Trove points them at its recording
proxy, which records every call this program makes.

    OPENAI_BASE_URL   the endpoint, ending in /v1 (required)
    OPENAI_API_KEY    sent as a bearer token when set
    OPENAI_MODEL      the model name (or TROVE_MODEL; default "default")
    TROVE_INSTRUCTION_FILE  the task (or --instruction-file, or --task TEXT)
    TROVE_MAX_STEPS   model turns before giving up (default 30)
    TROVE_SEED        sent as the request's `seed`, so a sample is reproducible
    MINI_AGENT_STREAM=1     ask for streamed answers (server-sent events)

Inside a Trove local sandbox it is at /opt/trove/harness/mini_agent.py. Exit codes: 0 submitted, 2 step
budget used up, 3 the model endpoint failed (printed as the endpoint gave it), 4 bad usage.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SYSTEM_PROMPT = f"""\
You are a helpful assistant that can interact with a computer shell to solve programming tasks.
Your response must contain exactly ONE bash code block with ONE command (or commands joined with && or ||),
like this:

```bash
ls -la
```

Every command runs in a new shell in the repository root. Commands must not be interactive.
When the task is done, and not before, run this command on its own:

```bash
echo {SUBMIT}
```
"""
OUTPUT_LIMIT = 10_000
COMMAND_TIMEOUT_S = 120
_BLOCK = re.compile(r"```(?:bash|sh)?[ \t]*\n(.*?)\n```", re.DOTALL)


class ModelError(Exception):
    """The endpoint failed; the message is what it said, as it said it."""


def main(argv: list[str]) -> int:
    options = parse_args(argv)
    try:
        instruction = read_instruction(options)
        base_url = os.environ["OPENAI_BASE_URL"].rstrip("/")
    except (OSError, KeyError) as exc:
        print(f"mini_agent: {exc}", file=sys.stderr)
        return 4
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"Please solve this task:\n\n{instruction}"}]
    for step in range(1, options.max_steps + 1):
        try:
            reply = chat(base_url, options, messages)
        except ModelError as exc:
            print(f"mini_agent: step {step}: model error: {exc}", flush=True)
            return 3
        messages.append({"role": "assistant", "content": reply})
        command = first_command(reply)
        if command is None:
            messages.append({"role": "user", "content": "Reply with exactly one ```bash block."})
            print(f"step {step}: no command in the reply", flush=True)
            continue
        code, output = run(command)
        print(f"step {step}: $ {command.splitlines()[0][:120]} -> exit {code}", flush=True)
        if output.lstrip().startswith(SUBMIT):
            print(f"submitted after {step} step(s)", flush=True)
            return 0
        messages.append({"role": "user", "content": f"exit code: {code}\n{output}"})
    print(f"gave up: {options.max_steps} step(s) used", flush=True)
    return 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A tiny bash-acting agent for OpenAI-compatible endpoints.")
    parser.add_argument("--task", help="the task text (else --instruction-file / TROVE_INSTRUCTION_FILE)")
    parser.add_argument("--instruction-file", default=os.environ.get("TROVE_INSTRUCTION_FILE"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL") or os.environ.get("TROVE_MODEL") or "default")
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("TROVE_MAX_STEPS") or 30))
    parser.add_argument("--stream", action="store_true", default=os.environ.get("MINI_AGENT_STREAM") == "1")
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("MINI_AGENT_TIMEOUT") or 300))
    return parser.parse_args(argv)


def read_instruction(options: argparse.Namespace) -> str:
    if options.task:
        return options.task
    if not options.instruction_file:
        raise OSError("no task: pass --task or --instruction-file, or set TROVE_INSTRUCTION_FILE")
    with open(options.instruction_file, encoding="utf-8") as handle:
        return handle.read()


def chat(base_url: str, options: argparse.Namespace, messages: list[dict]) -> str:
    body = {"model": options.model, "messages": messages, "stream": options.stream}
    if os.environ.get("TROVE_SEED"):
        body["seed"] = int(os.environ["TROVE_SEED"])
    headers = {"Content-Type": "application/json"}
    if os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=options.timeout) as response:
            return read_stream(response) if options.stream else read_body(response)
    except urllib.error.HTTPError as exc:
        raise ModelError(f"HTTP {exc.code}: {exc.read().decode('utf-8', 'replace')[:2000]}") from exc
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise ModelError(f"{type(exc).__name__}: {exc}") from exc


def read_body(response) -> str:
    try:
        return json.loads(response.read())["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"unexpected answer: {exc!r}") from exc


def read_stream(response) -> str:
    """Concatenate the content deltas of an SSE stream; a stream that ends before `[DONE]` is an error."""
    parts: list[str] = []
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return "".join(parts)
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise ModelError(f"malformed stream event: {data[:200]!r}") from exc
        if event.get("error"):
            raise ModelError(f"error event in the stream: {json.dumps(event['error'])[:500]}")
        for choice in event.get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or "")
    raise ModelError(f"the stream ended before [DONE] after {len(parts)} delta(s)")


def first_command(reply: str) -> str | None:
    match = _BLOCK.search(reply)
    return match.group(1).strip() if match and match.group(1).strip() else None


def run(command: str) -> tuple[int, str]:
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, errors="replace",
                              timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -1, f"the command timed out after {time.monotonic() - started:.0f}s"
    output = done.stdout + done.stderr
    if len(output) > OUTPUT_LIMIT:
        half = OUTPUT_LIMIT // 2
        output = f"{output[:half]}\n[... {len(output) - OUTPUT_LIMIT} characters cut ...]\n{output[-half:]}"
    return done.returncode, output


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
