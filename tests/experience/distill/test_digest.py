"""Run digests (experience.distill.digest): derived once from a run's steps, packed, unpacked, and made into
value-row inputs. No database: hand-made records."""

from __future__ import annotations

import orjson
import pytest
import zstandard
from distill_factories import TASK, careful_fix, command, message, model_call, record

from experience.distill.digest import DIGEST_VERSION, DigestError, RunDigest, derive, instruction_hash
from experience.records import MessageRecord, TrajectoryRecord

SYSTEM = "You are a careful software engineer. Reply with one bash command in a ```bash block."
BIG = 1_000_000  # a budget no context here reaches


def recorded_run(instruction: str = TASK, *, output: str = "ok") -> TrajectoryRecord:
    """Five decisions, each a model call that recorded the growing request (system, task, then an
    assistant reply and the command's output per earlier decision), and its command."""
    messages = [MessageRecord("system", SYSTEM), MessageRecord("user", instruction)]
    steps = []
    for n in range(5):
        reply = f"Step {n}: I run this.\n\n```bash\npython check_{n}.py\n```"
        steps.append(model_call(reply, request=list(messages)))
        text = f"{output} {n} " + "line of output\n" * 20
        steps.append(command(f"python check_{n}.py", text, 0 if n % 2 else 1))
        messages += [MessageRecord("assistant", reply), MessageRecord("user", f"exit code 0\n{text}")]
    return record(steps, instruction=instruction)


def rebuilt_run() -> TrajectoryRecord:
    """Decisions without recorded requests: their contexts are rebuilt from the steps."""
    return record([message("system", SYSTEM), message("user", TASK), *careful_fix()])


def roundtrip(digest: RunDigest) -> RunDigest:
    return RunDigest.decode(digest.encode())


@pytest.mark.parametrize("make", [recorded_run, rebuilt_run], ids=["recorded", "rebuilt"])
@pytest.mark.parametrize("budget", [BIG, 120, 1])
def test_a_decoded_digest_gives_the_same_inputs_as_the_derived_one(make, budget):
    run = make()
    derived = derive(run)

    decoded = roundtrip(derived)

    assert decoded == derived
    expected = list(derived.inputs(budget, run.instruction))
    assert len(expected) == len(derived.decisions) >= 5
    assert list(decoded.inputs(budget, run.instruction)) == expected


def test_inputs_number_the_decisions_and_carry_the_action_and_rubric_stats():
    run = rebuilt_run()

    rows = list(derive(run).inputs(BIG, run.instruction))

    assert [row["step_index"] for row in rows] == list(range(1, len(rows) + 1))
    assert {row["step_count"] for row in rows} == {len(rows)}
    assert [row["stats"]["actions_before"] for row in rows] == list(range(len(rows)))
    assert rows[0]["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    assert rows[0]["action"]["role"] == "assistant" and "create reproduce.py" in rows[0]["action"]["content"]
    assert all(row["stats"]["context_dropped"] == 0 for row in rows)
    # the repro fails at the 3rd command: one error before the 4th decision, none before the 3rd
    assert rows[2]["stats"]["errors_before"] == 0 and rows[3]["stats"]["errors_before"] == 1
    assert rows[-1]["stats"]["source_edits_before"] >= 1
    assert all(isinstance(value, bool) for row in rows for value in row["rubric"].values())


def test_a_small_budget_drops_messages_from_the_front_and_keeps_system_and_task():
    run = recorded_run()
    digest = derive(run)
    whole = list(digest.inputs(BIG, run.instruction))
    last = whole[-1]["messages"]
    head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    assert last[:2] == head and len(last) == 10 and whole[-1]["stats"]["context_dropped"] == 0

    tiny = list(digest.inputs(1, run.instruction))[-1]
    assert tiny["messages"] == head, "only system and task are kept, even over budget"
    assert tiny["stats"]["context_dropped"] == len(last) - 2

    budget = whole[-1]["stats"]["context_tokens"] // 2
    cut = list(digest.inputs(budget, run.instruction))[-1]
    kept = cut["messages"]
    assert kept[:2] == head
    assert 2 < len(kept) < len(last), "some, not all, of the later messages fit"
    assert kept[2:] == last[len(last) - (len(kept) - 2) :], "the most recent messages are the ones kept"
    assert cut["stats"]["context_dropped"] == len(last) - len(kept)
    assert cut["stats"]["context_tokens"] <= budget < whole[-1]["stats"]["context_tokens"]
    # the action and rubric do not depend on the budget
    assert cut["action"] == whole[-1]["action"] and cut["rubric"] == whole[-1]["rubric"]


def test_a_run_with_no_decisions_gives_no_inputs_before_and_after_packing():
    run = record([message("system", SYSTEM), message("user", TASK), model_call("")])

    digest = derive(run)

    assert digest.decisions == ()
    assert list(digest.inputs(BIG, run.instruction)) == []
    assert list(roundtrip(digest).inputs(BIG, run.instruction)) == []


def test_decode_refuses_bytes_that_are_not_a_digest():
    with pytest.raises(DigestError, match="not a run digest"):
        RunDigest.decode(b"certainly not zstd")
    with pytest.raises(DigestError, match="not a run digest"):
        RunDigest.decode(zstandard.ZstdCompressor().compress(b"{not json"))
    with pytest.raises(DigestError, match="run digest version None"):
        RunDigest.decode(zstandard.ZstdCompressor().compress(b"[1, 2, 3]"))


def test_decode_refuses_a_digest_of_another_version_naming_both_versions():
    data = derive(recorded_run()).encode()
    document = orjson.loads(zstandard.ZstdDecompressor().decompress(data))
    assert document["version"] == DIGEST_VERSION
    document["version"] = "digest-0+old"

    with pytest.raises(DigestError) as raised:
        RunDigest.decode(zstandard.ZstdCompressor().compress(orjson.dumps(document)))

    assert "'digest-0+old'" in str(raised.value) and repr(DIGEST_VERSION) in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_lone_surrogate_text_in_a_message_survives_packing():
    odd = "bytes \udcff\ud800 from a harness"
    run = recorded_run(output=odd)
    derived = derive(run)
    assert any(odd in str(m.get("content")) for m in derived.messages)

    decoded = roundtrip(derived)

    assert decoded == derived
    assert list(decoded.inputs(BIG, run.instruction)) == list(derived.inputs(BIG, run.instruction))


def test_the_instruction_hash_is_stable_and_takes_lone_surrogates():
    assert instruction_hash(TASK) == instruction_hash(TASK) != instruction_hash(TASK + " ")
    assert len(instruction_hash("task \ud800")) == 64
