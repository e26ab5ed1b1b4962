"""Recorded model traffic with real token ids, for the RL sample tests and benchmark.

`TokenServer` stands in for a vLLM-style server that returns token ids: it renders the request's messages
with a ChatML template, tokenises them with a real `tokenizers` BPE tokenizer (trained here, saved as a
tokenizer.json), "generates" a scripted reply and keeps its own record of what it generated (ids and
logprobs). Each call goes through the proxy's own `CallRecord.to_step_record`, so the steps carry token ids
exactly where the recording proxy puts them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from experience.records import StepRecord
from webapp.proxy.records import CallRecord

SPECIALS = ["<|im_start|>", "<|im_end|>"]
CORPUS = [
    "You are a careful software agent. Fix the failing test in the repository.",
    "ls -la && cat README.md && python -m pytest -q tests/test_calc.py",
    "The tests failed: AssertionError expected 4 got 5 in calc/lexer.py line 12",
    "I will edit the lexer to handle negative numbers, then run the tests again.",
    "Summary of earlier turns: the agent listed files and read the failing test.",
    "<system-reminder>You have 3 steps left.</system-reminder> tool user assistant system",
    '{"command": "sed -i s/x/y/ calc/lexer.py"} 0123456789 passed failed ok',
]


def train_tokenizer(path: Path) -> Path:
    """A small byte-level BPE tokenizer with the ChatML specials, saved as tokenizer.json."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 5, trainer=trainer)
    tokenizer.save(str(path))
    return path


def render(message: dict[str, Any], *, compact_args: bool = False) -> str:
    """The server's chat template for one message (ChatML, tool calls as JSON in <tool_call>)."""
    body = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        if compact_args:  # a template that re-serialises past tool-call arguments
            arguments = json.dumps(json.loads(arguments), separators=(",", ":"))
        body += f"<tool_call>{json.dumps({'name': call['function']['name'], 'arguments': arguments})}</tool_call>"
    return f"<|im_start|>{message['role']}\n{body}<|im_end|>\n"


class TokenServer:
    """A model server returning prompt and completion token ids and logprobs, recording what it generated."""

    def __init__(self, tokenizer_path: Path, *, compact_past_args: bool = False, policy_version: str = "v1"):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.compact_past_args = compact_past_args
        self.policy_version = policy_version
        self.generated: list[dict[str, Any]] = []  # per call: the completion ids and their logprobs

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def complete(self, messages: list[dict[str, Any]], reply: dict[str, Any], *, with_ids: bool = True) -> StepRecord:
        prompt = "".join(render(m, compact_args=self.compact_past_args) for m in messages) + "<|im_start|>assistant\n"
        # The model generates the body and its end-of-turn token; the "\n" after it is the template's.
        completion = self.encode(render({"role": "assistant", **reply})[len("<|im_start|>assistant\n"):-1])
        logprobs = [-((token * 37) % 1000) / 1000 - 0.001 for token in completion]
        self.generated.append({"ids": completion, "logprobs": logprobs})
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", **reply}, "finish_reason": "stop"}
        response: dict[str, Any] = {"id": f"c{len(self.generated)}", "model": "stand-in", "choices": [choice]}
        if with_ids:
            choice["logprobs"] = {"content": [{"token": str(t), "logprob": lp} for t, lp in zip(completion, logprobs, strict=True)]}
            choice["token_ids"] = completion
            response["prompt_token_ids"] = self.encode(prompt)
        now = datetime.now(UTC)
        record = CallRecord(call_id=f"call-{len(self.generated)}", rollout_id="1", trajectory_id="t", started_at=now,
                            ended_at=now, latency_ms=1.0, ttft_ms=None, request={"model": "m", "messages": messages},
                            response=response, status_code=200)
        step = record.to_step_record()
        if with_ids:
            step.payload["policy_version"] = self.policy_version
        return step


def tool_reply(turn: int, command: str) -> dict[str, Any]:
    return {"content": f"Step {turn}: I will run a command.",
            "tool_calls": [{"id": f"call_{turn}", "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}


def agent_run(server: TokenServer, turns: int, *, with_ids: bool = True, edit=None) -> list[StepRecord]:
    """A harness loop: each turn's reply and its tool result join the history; `edit(turn, messages)` may
    change the history before a call (compaction, a reminder, a re-rendered turn)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software agent."},
        {"role": "user", "content": "Fix the failing test in the repository."},
    ]
    steps = []
    for turn in range(turns):
        if edit is not None:
            messages = edit(turn, messages)
        last = turn == turns - 1
        reply = {"content": "The tests passed, done."} if last else tool_reply(turn, f"python -m pytest -q #{turn}")
        steps.append(server.complete(messages, reply, with_ids=with_ids))
        messages = [*messages, {"role": "assistant", **reply}]
        if not last:
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": f"{turn} passed 1 failed"})
    return steps
