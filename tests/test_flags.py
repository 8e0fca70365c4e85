"""Record flags (issue 7): each detector on hand-made answers, its recall and false-positive
rate on ordinary text and on the simulated server's answers, and flags on every record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from flag_eval import hand_made_answers, score

from conftest import SAMPLES, make_config, read_records, sim_config
from eagledata.quality.flags import ALL_FLAGS, FlagDetector, LoopRule, loop_period
from eagledata.run import pipeline
from eagledata.rundir.lines import FLAG_NAMES, RecordFlags, RecordLine
from eagledata.rundir.status import run_status
from eagledata.simserver import SimServerThread

STOP = 2  # <|im_end|> in the bundled tokenizer
THINK_OPEN, THINK_CLOSE = 3, 4


@pytest.fixture(scope="module")
def detector(prompt_tokenizer: Any) -> FlagDetector:
    return FlagDetector.from_vocab(prompt_tokenizer.token_id, prompt_tokenizer.roundtrip)


def backend(prompt_tokenizer: Any) -> Any:
    return prompt_tokenizer._tokenizer.backend_tokenizer


def flags_of(detector: FlagDetector, output: list[int], **kwargs: Any) -> list[str]:
    fields: dict[str, Any] = {"input_ids": [5, 6], "finish_reason": "stop", "matched": STOP}
    fields.update(kwargs)
    return detector.flags(output_ids=output, **fields)


def test_think_tokens_are_found_in_the_vocabulary(detector: FlagDetector) -> None:
    assert (detector.think_open, detector.think_close) == (THINK_OPEN, THINK_CLOSE)


def test_each_flag_on_a_hand_made_answer(detector: FlagDetector, prompt_tokenizer: Any) -> None:
    tok = backend(prompt_tokenizer)
    clean = tok.encode("The capital of Australia is Canberra.", add_special_tokens=False).ids
    assert flags_of(detector, [*clean, STOP]) == []
    assert flags_of(detector, clean, finish_reason="length", matched=None) == ["truncated"]
    assert flags_of(detector, [STOP]) == ["empty"]
    loop = clean + tok.encode(" and again", add_special_tokens=False).ids * 20
    assert "degenerate" in flags_of(detector, loop, finish_reason="length", matched=None)
    # " the" spelled as " " + "the": same text, ids no tokenizer would produce
    word = tok.encode(" the", add_special_tokens=False).ids
    pieces = [tok.token_to_id("Ġ"), tok.token_to_id("the")]
    assert len(word) == 1 and None not in pieces and pieces != word
    assert flags_of(detector, [*clean, *pieces, STOP]) == ["roundtrip_mismatch"]
    # A think block opened by the template (prompt) or by the model, never closed.
    assert flags_of(detector, [*clean, STOP], input_ids=[5, THINK_OPEN]) == ["unbalanced_think"]
    assert flags_of(detector, [THINK_OPEN, *clean, STOP]) == ["unbalanced_think"]
    closed = [*clean, THINK_CLOSE, *clean, STOP]
    assert flags_of(detector, closed, input_ids=[5, THINK_OPEN]) == []
    assert flags_of(detector, [THINK_OPEN, *clean, THINK_CLOSE, *clean, STOP]) == []


def test_loop_rule_needs_three_repeats_and_enough_tokens() -> None:
    text = list(range(100, 140))
    assert loop_period(text + [7] * 31) is None  # 31 repeats of one token: under min_tokens
    assert loop_period(text + [7] * 32) == 1
    span = list(range(200, 220))
    assert loop_period(text + span * 2) is None  # a passage quoted twice is not a loop
    assert loop_period(text + span * 3) == 20
    assert loop_period(text + span * 3 + [9]) is None  # the loop must be at the end
    assert loop_period(list(range(300)) * 2, LoopRule(max_period=256)) is None


def _splitter(tok: Any) -> Any:
    def split(token: int) -> list[int] | None:
        piece = tok.id_to_token(token)
        if piece is None or token < 5:
            return None
        for k in range(1, len(piece)):
            left, right = tok.token_to_id(piece[:k]), tok.token_to_id(piece[k:])
            if left is not None and right is not None:
                return [left, right]
        return None

    return split


def _starts_word(tok: Any) -> Any:
    return lambda token: tok.decode([token])[:1].isspace()


@pytest.mark.slow
def test_recall_and_false_positive_rate_on_hand_made_answers(
    detector: FlagDetector, prompt_tokenizer: Any
) -> None:
    tok = backend(prompt_tokenizer)
    answers = hand_made_answers(
        lambda text: list(tok.encode(text, add_special_tokens=False).ids),
        stop_id=STOP,
        think_open=THINK_OPEN,
        think_close=THINK_CLOSE,
        split=_splitter(tok),
        starts_word=_starts_word(tok),
    )
    scores = score(detector, answers)
    for flag, tally in scores.items():
        assert tally.positives > 0 and tally.negatives > 500, flag
        assert tally.recall == 1.0, (flag, tally.missed[:10])
        # the bar: well under 1% false positives on ordinary answers
        assert tally.false_positive_rate is not None and tally.false_positive_rate < 0.002, (
            flag,
            tally.missed[:10],
        )


def test_flags_on_every_record_match_what_the_simulator_made(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    server = sim_config(tokenizer_dir, empty_rate=0.05, loop_rate=0.1)
    with SimServerThread(server) as sim:
        config = make_config(
            [sim.url],
            out,
            generation={"max_new_tokens": 512, "temperature": 0.6, "samples_per_prompt": 8},
            run={"concurrency": 32, "shard_size": 1000},
        )
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
        shapes = sim.stats()["answers"]["shapes"]
    records = read_records(out)
    # every record holds every flag, true or false: one Arrow type whatever the answers
    assert len(records) == 320
    assert all(list(r["flags"]) == list(FLAG_NAMES) for r in records)
    assert all(type(value) is bool for r in records for value in r["flags"].values())
    for flag, shape in (("degenerate", "loop"), ("empty", "empty")):
        made = {r["rid"] for r in records if shapes.get(r["rid"]) == shape}
        flagged = {r["rid"] for r in records if r["flags"][flag]}
        assert made, shape
        assert flagged == made, flag  # recall 100%, no false positive
    truncated = {r["rid"] for r in records if r["finish_reason"] == "length"}
    assert truncated == {r["rid"] for r in records if r["flags"]["truncated"]}
    # status counts the flags where it counts everything else
    report = run_status(out)
    assert report.flags["degenerate"] == sum(r["flags"]["degenerate"] for r in records)
    assert report.to_json()["quality"]["flags"] == report.flags


def test_every_flag_a_detector_names_is_a_field_a_record_holds() -> None:
    # quality/flags.py names the flags; rundir/lines.py (below it) holds them in the record
    assert ALL_FLAGS == FLAG_NAMES
    fired = RecordFlags.of(["degenerate", "truncated"])
    assert fired.names() == ["truncated", "degenerate"]  # the declared order
    assert orjson.loads(orjson.dumps(fired.__dict__)) == {
        "truncated": True, "empty": False, "degenerate": True,
        "roundtrip_mismatch": False, "unbalanced_think": False,
    }  # fmt: skip
    with pytest.raises(ValueError, match="unknown flag 'shiny'"):
        RecordFlags.of(["shiny"])


def test_a_record_written_when_flags_were_a_list_reads_as_the_same_flags() -> None:
    record = {
        "id": "d/1/0", "dataset": "d", "row_id": "1", "sample": 0, "finish_reason": "length",
        "prompt_tokens": 1, "completion_tokens": 1, "messages": [], "input_ids": [5],
        "output_ids": [9], "text": "",
    }  # fmt: skip
    listed = RecordLine.parse(orjson.dumps({**record, "flags": ["truncated"]}))
    assert listed.flags == RecordFlags(truncated=True)
    assert RecordLine.parse(orjson.dumps({**record, "flags": []})).flags == RecordFlags()
    assert RecordLine.parse(orjson.dumps(record)).flags is None  # before flags existed
