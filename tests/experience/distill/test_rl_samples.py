"""Chaining a rollout's model calls into token-exact samples, and the forks' causes."""

from __future__ import annotations

import pytest

from experience.distill.rl_samples import assemble, model_calls, tokenizer_encoder
from tests.experience.distill.rl_traffic import TokenServer, agent_run, render


@pytest.fixture
def server(tokenizer_path):
    return TokenServer(tokenizer_path)


def compacted(turn, messages):
    if turn != 3:
        return messages
    return [messages[0], {"role": "user", "content": "Summary of earlier turns: the agent listed files."}]


def reminded(turn, messages):
    if turn != 2:
        return messages
    reminder = {"role": "system", "content": "<system-reminder>3 steps left</system-reminder>"}
    return [*messages[:4], reminder, *messages[4:]]  # before the last assistant turn


def rerendered(turn, messages):
    if turn != 3:
        return messages
    edited = [dict(m) for m in messages]
    edited[2] = {**edited[2], "content": ""}  # the harness drops the text of its first assistant turn
    return edited


def test_a_continuing_history_is_one_sample_whose_mask_and_logprobs_are_what_the_server_generated(server):
    steps = agent_run(server, 5)
    assembly = assemble(model_calls(steps))
    assert assembly.exact and len(assembly.samples) == 1 and assembly.forks == []
    sample = assembly.samples[0]
    generated = [token for call in server.generated for token in call["ids"]]
    assert [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == generated
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == \
        [lp for call in server.generated for lp in call["logprobs"]]
    assert all(lp is None for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if not m)
    # The whole sample is the last prompt and its completion, token for token.
    assert sample.token_ids == steps[-1].payload["prompt_token_ids"] + steps[-1].payload["token_ids"]
    assert sample.calls == [0, 1, 2, 3, 4] and sample.policy_version == "v1"


def test_tool_results_between_calls_are_in_the_sample_with_mask_zero(server):
    sample = assemble(model_calls(agent_run(server, 2))).samples[0]
    tool_result = server.encode(render({"role": "tool", "content": "0 passed 1 failed"}))
    start = next(i for i in range(len(sample.token_ids)) if sample.token_ids[i:i + len(tool_result)] == tool_result)
    assert sample.loss_mask[start:start + len(tool_result)] == [0] * len(tool_result)


def test_a_compacted_history_forks_with_cause_compaction(server):
    assembly = assemble(model_calls(agent_run(server, 5, edit=compacted)))
    assert len(assembly.samples) == 2
    fork = assembly.samples[1].fork
    assert (fork.cause, fork.seq, fork.message_index) == ("compaction", 3, 1)
    # The first token that differs is the first of the summary's text, after the kept system prompt.
    kept = render({"role": "system", "content": "You are a careful software agent."}) + "<|im_start|>user\n"
    assert fork.token_index == len(server.encode(kept))
    assert assembly.samples[1].calls == [3, 4]


def test_an_inserted_system_reminder_forks_with_cause_system_reminder(server):
    assembly = assemble(model_calls(agent_run(server, 4, edit=reminded)))
    fork = assembly.samples[1].fork
    assert fork.cause == "system_reminder" and fork.seq == 2 and "inserted" in fork.detail
    assert fork.message_index == 4  # the reminder stands where the last assistant turn was


def test_a_reminder_added_after_the_history_extends_the_sample(server):
    def appended(turn, messages):
        reminder = {"role": "user", "content": "<system-reminder>3 steps left</system-reminder>"}
        return [*messages, reminder] if turn == 2 else messages

    assembly = assemble(model_calls(agent_run(server, 4, edit=appended)))
    assert len(assembly.samples) == 1 and assembly.forks == []


def test_an_edited_earlier_turn_forks_with_cause_rerendered_turn(server):
    fork = assemble(model_calls(agent_run(server, 5, edit=rerendered))).samples[1].fork
    assert (fork.cause, fork.message_index, fork.seq) == ("rerendered_turn", 2, 3)


def test_a_template_that_renders_the_same_messages_to_other_tokens_forks_at_the_first_differing_token(tokenizer_path):
    # The server re-serialises past tool-call arguments: the harness's messages are unchanged, the tokens not.
    server = TokenServer(tokenizer_path, compact_past_args=True)
    steps = agent_run(server, 3)
    assembly = assemble(model_calls(steps))
    assert len(assembly.samples) == 3
    fork = assembly.samples[1].fork
    first, second = steps[0].payload, steps[1].payload["prompt_token_ids"]
    expected = next(i for i, (a, b) in enumerate(zip(first["prompt_token_ids"] + first["token_ids"], second, strict=False)) if a != b)
    assert (fork.cause, fork.token_index) == ("rerendered_turn", expected)


def test_without_token_ids_the_calls_are_chained_on_messages_and_marked_retokenised(server, tokenizer_path):
    steps = agent_run(server, 4, with_ids=False)
    encode = tokenizer_encoder(str(tokenizer_path))
    assembly = assemble(model_calls(steps), encode=encode)
    assert not assembly.exact and len(assembly.samples) == 1
    sample = assembly.samples[0]
    assert sample.exact is False
    # The same tokens the server's template gives the whole conversation: each message tokenised once.
    assert [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == \
        [t for call in server.generated for t in call["ids"] + encode("\n")]


def test_without_token_ids_a_compaction_still_forks_with_its_cause(server, tokenizer_path):
    steps = agent_run(server, 5, with_ids=False, edit=compacted)
    assembly = assemble(model_calls(steps), encode=tokenizer_encoder(str(tokenizer_path)))
    assert [s.fork.cause if s.fork else None for s in assembly.samples] == [None, "compaction"]


def test_exact_and_retokenised_calls_are_never_mixed_in_a_rollout(server, tokenizer_path):
    steps = agent_run(server, 2) + agent_run(server, 1, with_ids=False)
    assert assemble(model_calls(steps), encode=tokenizer_encoder(str(tokenizer_path))).exact is False
    without_tokenizer = assemble(model_calls(steps))
    assert without_tokenizer.samples == [] and "no token ids" in without_tokenizer.note


def test_logprobs_that_do_not_match_the_ids_one_for_one_are_dropped_not_shifted(server):
    steps = agent_run(server, 1)
    steps[0].payload["logprobs"] = steps[0].payload["logprobs"][1:]
    sample = assemble(model_calls(steps)).samples[0]
    assert sum(sample.loss_mask) == len(server.generated[0]["ids"]) and set(sample.logprobs) == {None}


def test_completion_ids_spelled_as_logprob_tokens_are_read_when_the_server_returns_no_token_ids(server):
    # vLLM's return_tokens_as_token_ids: each logprob's token is "token_id:<id>", and no token_ids field.
    steps = agent_run(server, 1)
    payload = steps[0].payload
    payload["logprobs"] = [{"token": f"token_id:{t}", "logprob": lp["logprob"]}
                           for t, lp in zip(payload.pop("token_ids"), payload["logprobs"], strict=True)]
    sample = assemble(model_calls(steps)).samples[0]
    assert [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m] == server.generated[0]["ids"]
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == server.generated[0]["logprobs"]
