"""Issue 23: a hostile server (tests/hostile.py) that speaks SGLang's shapes and misbehaves one
way per case. Every bad answer is checked before anything reads it and ends as an item failure
(``contract_violation``), never a crash and never a record; every wait has a deadline.

Sample 0 of each prompt gets the bad answer, sample 1 the honest one: each run shows both sides.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, make_config, read_failures, read_records
from eagledata.config import AppConfig
from eagledata.errors import ServerError
from eagledata.export import ExportOptions, export_runs
from eagledata.run import pipeline
from eagledata.rundir.verify import verify_run
from hostile import HostileServer

DATASET = str(SAMPLES / "prompts.jsonl")
ROWS = 4
VOCAB = 3000  # the bundled tokenizer's


def hostile_config(url: str, out: Path, **sections: dict[str, Any]) -> AppConfig:
    base: dict[str, dict[str, Any]] = {
        "generation": {"samples_per_prompt": 2, "max_new_tokens": 32},
        "run": {"limit": ROWS, "concurrency": 4},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return make_config([url], out, **base)


def check_split(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Sample 1 landed as records (ids inside the vocabulary), sample 0 failed, each once."""
    records, failures = read_records(out), read_failures(out)
    assert sorted(r["id"] for r in records) == [f"prompts/#{row}/1" for row in range(ROWS)]
    assert sorted(f["id"] for f in failures) == [f"prompts/#{row}/0" for row in range(ROWS)]
    for record in records:
        assert all(0 <= token < VOCAB for token in record["output_ids"])
        assert len(record["output_ids"]) <= 33
    assert {f["reason"] for f in failures} == {"contract_violation"}
    assert {f["attempts"] for f in failures} == {1}
    return records, failures


ID_CASES = {
    "id_negative": "output_ids[0] is -1, outside the tokenizer's vocabulary [0, 3000)",
    "id_2_33": "is 8589934592, outside the tokenizer's vocabulary [0, 3000)",
    "ids_shifted": "output_ids[0] is 10",  # every id + 10,000,000
    "id_string": "output_ids[1] is '12', not an integer token id",
    "id_float": "output_ids[1] is 12.0, not an integer token id",
    "id_bool": "output_ids[1] is True, not an integer token id",
    "id_null": "output_ids[1] is None, not an integer token id",
}


@pytest.mark.parametrize("case", sorted(ID_CASES))
def test_an_id_outside_the_vocabulary_is_an_item_failure_and_resume_does_not_crash(
    tokenizer_dir: str, tmp_path: Path, case: str
) -> None:
    """Today -1 or 2**33 crashed the run in the flags' decode (OverflowError), and every
    resume again; every id + 10,000,000 was written and exported."""
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, case) as server:
        config = hostile_config(server.url, out)
        summary = pipeline.generate(config, DATASET, None, progress=False)
        assert (summary.written, summary.failed, summary.left) == (ROWS, ROWS, 0)
        _, failures = check_split(out)
        assert all(ID_CASES[case] in f["message"] for f in failures), failures[0]["message"]
        # against the same server, resume (and a retry of the failures) ends the same way
        assert pipeline.resume(out, progress=False).left == 0
        again = pipeline.resume(out, retry_failed=True, progress=False)
        assert (again.written, again.failed, again.left) == (ROWS, ROWS, 0)
        check_split(out)
    assert verify_run(out, full=True).ok
    export_runs([out], tmp_path / "train.jsonl", ExportOptions())
    rows = [orjson.loads(line) for line in (tmp_path / "train.jsonl").read_bytes().splitlines()]
    assert len(rows) == ROWS  # the trainer gets only ids of the vocabulary
    assert all(0 <= token < VOCAB for row in rows for token in row["input_ids"])


def test_more_ids_than_asked_for_is_an_item_failure(tokenizer_dir: str, tmp_path: Path) -> None:
    """~1,000 ids for max_new_tokens 32, counts consistent: today written, and verify said ok."""
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, "too_many_ids") as server:
        pipeline.generate(hostile_config(server.url, out), DATASET, None, progress=False)
    _, failures = check_split(out)
    assert "server returned 1012 ids, 32 were asked for (max_new_tokens)" in failures[0]["message"]


@pytest.mark.parametrize("case", ["huge_text", "huge_chunked"])
def test_an_answer_larger_than_the_request_allows_is_refused_unread(
    tokenizer_dir: str, tmp_path: Path, case: str
) -> None:
    """A 50 MB text (declared up front, or chunked) is refused at a bound derived from the
    request, never read whole, never stored."""
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, case) as server:
        pipeline.generate(hostile_config(server.url, out), DATASET, None, progress=False)
        sent = server.sent_bytes
    _, failures = check_split(out)
    assert "answer refused unread" in failures[0]["message"]
    assert "more than an answer to this request can hold" in failures[0]["message"]
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    assert size < 2**20  # nothing of the 50 MB landed
    if case == "huge_chunked":  # the reader stopped early: the server could not send it all
        assert sent < ROWS * 50 * 2**20


@pytest.mark.parametrize("case", ["provenance_types", "float_counts"])
def test_fields_of_the_wrong_type_never_crash_the_writer(
    tokenizer_dir: str, tmp_path: Path, case: str
) -> None:
    """A count that is a float is a contract violation; a provenance field of the wrong type
    (weight_version 7, cached_tokens true, a boolean stop token) is dropped: the record holds the
    field's typed none."""
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, case) as server:
        summary = pipeline.generate(hostile_config(server.url, out), DATASET, None, progress=False)
    assert summary.left == 0
    records, failures = read_records(out), read_failures(out)
    if case == "float_counts":
        check_split(out)
        assert "meta_info.prompt_tokens is 12.0, not an integer" in failures[0]["message"] or (
            "not an integer" in failures[0]["message"]
        )
    else:
        assert len(records) == 2 * ROWS and failures == []
        for record in records:
            # dropped: written as the field's typed none ("" and -1), never null
            assert record["weight_version"] in ("", "default")
            assert record["cached_tokens"] in (-1, 0)
            assert type(record["matched_token_id"]) is int
    assert verify_run(out, full=True).ok


@pytest.mark.slow
def test_a_server_trickling_bytes_is_cut_at_the_requests_whole_deadline(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """One byte every 0.2 s: each read is quick, so only a deadline on the whole request ends
    it (today request_timeout_s bounded only the gap between reads: 524 s for one request)."""
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, "trickle", trickle_s=0.2) as server:
        config = hostile_config(
            server.url,
            out,
            server={"request_timeout_s": 1.0, "max_attempts": 2},
            run={"limit": 2},
        )
        started = time.monotonic()
        summary = pipeline.generate(config, DATASET, None, progress=False)
        took = time.monotonic() - started
    failures = read_failures(out)
    assert summary.failed == 2 and {f["reason"] for f in failures} == {"timeout"}
    assert "no whole answer within 1s" in failures[0]["message"]
    # two attempts of at most 1 s each, and the server's probe: not the ~100 s a trickled
    # answer takes; the bound is generous for a loaded machine
    assert took < 30


def test_the_canary_never_takes_an_id_outside_the_vocabulary(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The canary's references are the server's own ids: one of -1 is a refused answer, said
    in one line, never a crash deep in the canary's statistics."""
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, "id_negative", only_sample=None) as server:
        config = hostile_config(
            server.url,
            out,
            canary={
                "enabled": True,
                "prompts": 2,
                "probes": 1,
                "reference_tokens": 8,
                "probe_tokens": 4,
                "baseline_idle_runs": 1,
                "baseline_load_runs": 0,
            },
        )
        with pytest.raises(ServerError) as refused:
            pipeline.generate(config, DATASET, None, progress=False)
    assert str(refused.value) == (
        f"{server.url}: a canary answer broke the token contract: output_ids[0] is -1, outside "
        "the tokenizer's vocabulary [0, 3000)"
    )
    assert read_records(out) == []


@pytest.mark.slow  # waits out the abort's own 5 s bound on every timed-out request
def test_a_dripped_answer_leaves_no_unretrieved_task_exception(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The abort sent for each timed-out request ran in a shielded task nobody retrieved: when
    the server was as slow to answer the abort (here: 6 s, past the abort's own 5 s), ~60
    lines of "Task exception was never retrieved" at the end of the run."""
    import subprocess

    from conftest import TOKENIZER, eagledata_cmd

    slow_abort = {"/abort_request": "slow"}
    with HostileServer(tokenizer_dir, "trickle", trickle_s=6.0, spoiled=slow_abort) as server:
        config = tmp_path / "eagledata.toml"
        config.write_text(
            f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{server.url}"]\n'
            "request_timeout_s = 1.0\nmax_attempts = 2\n"
            "[generation]\nmax_new_tokens = 32\nsamples_per_prompt = 2\n"
            "[run]\nconcurrency = 4\nlimit = 2\n[canary]\nenabled = false\n"
        )
        done = subprocess.run(
            eagledata_cmd("generate", "--config", str(config), "--dataset", DATASET, "--out",
                          str(tmp_path / "run"), "--no-progress"),
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert "never retrieved" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert {f["reason"] for f in read_failures(tmp_path / "run")} == {"timeout"}
