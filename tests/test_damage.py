"""Issue 23, item 3: a damaged run directory has a way back, and no run adopts data that is not
its own: ``verify --repair`` moves unreadable lines into ``quarantine.jsonl`` and ``resume``
generates their items again; ``resume`` seals only whole records; lines carry the settings
fingerprint; the lock is on the folder itself."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from conftest import (
    SAMPLES,
    TOKENIZER,
    eagledata_cmd,
    make_config,
    read_failures,
    read_records,
    run_cli,
    sim_config,
)
from eagledata.errors import RunDirError
from eagledata.export import ExportOptions, export_runs
from eagledata.run import pipeline
from eagledata.rundir.lines import QuarantineLine
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.shardindex import load_index, read_index
from eagledata.rundir.shardindex_format import STALE, index_path
from eagledata.rundir.totals import sealed_shards
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread

DATASET = str(SAMPLES / "prompts.jsonl")
LIMIT = 12


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


@pytest.fixture
def sim(tokenizer_dir: str) -> Iterator[SimServerThread]:
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        yield server


def finished_run(sim: SimServerThread, out: Path, **generation: object) -> Path:
    config = make_config(
        [sim.url], out, run={"limit": LIMIT, "shard_size": 5}, generation=dict(generation)
    )
    summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.written == LIMIT and summary.left == 0
    return out


def quarantined(out: Path) -> list[QuarantineLine]:
    return [
        QuarantineLine.parse(line) for line in (out / "quarantine.jsonl").read_bytes().splitlines()
    ]


def test_a_garbage_line_in_a_sealed_shard_no_longer_blocks_the_run_for_good(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Today one garbage line blocked export for good and verify's advice did not clear it."""
    out = finished_run(sim, tmp_path / "run")
    shard = sealed_shards(out)[1]
    lines = shard.read_bytes().splitlines(keepends=True)
    lost = orjson.loads(lines[2])["id"]
    lines[2] = lines[2][: len(lines[2]) // 2] + b"\n"  # half a record, then a garbage line
    shard.write_bytes(b"".join([*lines, b"\x00\xffgarbage\n"]))

    with pytest.raises(RunDirError, match="--repair' to move it aside"):
        export_runs([out], tmp_path / "train.jsonl", ExportOptions())
    checked = cli("verify", str(out), "--full")
    assert checked.returncode == 1
    assert f"run 'eagledata verify {out} --repair' to move it aside" in checked.stdout

    repaired = cli("verify", str(out), "--repair")
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout == (
        f"moved 2 unreadable line(s) into {out}/quarantine.jsonl "
        f"(shards/{shard.name} 2) and rebuilt the shard indexes; 'eagledata resume {out}' "
        "will generate their items again\n"
    )
    moved = quarantined(out)
    assert [(m.source, m.line, m.id) for m in moved] == [
        (f"shards/{shard.name}", 3, None),  # half a record: its id may not parse
        (f"shards/{shard.name}", len(lines) + 1, None),
    ]
    assert moved[1].encoding == "base64" and moved[0].encoding == "utf-8"
    assert load_index(shard).records == len(lines) - 1  # the index matches the shard again
    export_runs([out], tmp_path / "train.jsonl", ExportOptions())  # no longer blocked

    summary = pipeline.resume(out, progress=False)
    assert summary.session_records == 1 and summary.left == 0
    assert lost in {r["id"] for r in read_records(out)}
    report = verify_run(out, full=True)
    assert report.ok, report.problems
    again = cli("verify", str(out), "--repair")
    assert again.stdout.startswith("nothing to repair")


def test_a_bad_failure_line_is_repaired_too(sim: SimServerThread, tmp_path: Path) -> None:
    out = finished_run(sim, tmp_path / "run")
    with (out / "failures.jsonl").open("ab") as handle:
        handle.write(b'{"id": "prompts/0/0", "reason": "x"}\n')
    assert cli("status", str(out)).returncode == 5  # one line naming the fix, no traceback
    repaired = cli("verify", str(out), "--repair")
    assert repaired.returncode == 0 and "(failures.jsonl 1)" in repaired.stdout
    assert cli("status", str(out)).returncode == 0
    assert verify_run(out, full=True).ok


def test_resume_seals_only_whole_records(sim: SimServerThread, tmp_path: Path) -> None:
    """A crashed run's journal: a half record line appended to it (newline and all) is moved
    into the quarantine and its item generated again, never sealed into shards/ (today it
    was)."""
    out = finished_run(sim, tmp_path / "run")
    shard = sealed_shards(out)[-1]
    journal = out / "pending" / shard.name
    shard.rename(journal)  # as a crash leaves it: the journal was never sealed
    index_path(shard).unlink()
    lines = journal.read_bytes().splitlines(keepends=True)
    lost = orjson.loads(lines[-1])["id"]
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1][:40] + b"\n" + b'{"id": "x", "inp')

    summary = pipeline.resume(out, progress=False)
    assert summary.session_records == 1 and summary.left == 0
    assert not list((out / "pending").glob("*.jsonl"))
    sealed = shard.read_bytes()
    assert all(line.startswith(b'{"id":') for line in sealed.splitlines())
    assert [m.source for m in quarantined(out)] == [f"pending/{shard.name}"]
    records = read_records(out)
    assert sorted(r["id"] for r in records) == sorted({r["id"] for r in records})
    assert lost in {r["id"] for r in records} and len(records) == LIMIT
    assert verify_run(out, full=True).ok


def test_a_new_run_json_never_adopts_records_made_under_other_settings(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Today: delete run.json, generate --max-new-tokens 64 adopted the 12 records made at 32
    and verify --full said ok."""
    out = finished_run(sim, tmp_path / "run", max_new_tokens=32)
    (out / "run.json").unlink()
    config = make_config(
        [sim.url], out, run={"limit": LIMIT, "shard_size": 5}, generation={"max_new_tokens": 64}
    )
    with pytest.raises(RunDirError) as refused:
        pipeline.generate(config, DATASET, None, progress=False)
    message = str(refused.value)
    assert message.startswith(f"{out} holds {LIMIT} records or failures made under other settings")
    assert message.endswith(
        f"restore the run.json they were made with and 'eagledata resume {out}', or pass a new "
        "--out"
    )
    assert not (out / "run.json").exists()
    # the same settings: the records are the run's own, and it carries on
    config = make_config(
        [sim.url], out, run={"limit": LIMIT, "shard_size": 5}, generation={"max_new_tokens": 32}
    )
    summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.session_records == 0 and summary.written == LIMIT


def test_lines_without_a_fingerprint_need_the_run_json_they_were_made_under(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Lines an earlier eagledata wrote carry no fingerprint: their run.json vouches for them
    (resume goes on), nothing else does (a new run.json refuses them)."""
    out = finished_run(sim, tmp_path / "run")
    for shard in sealed_shards(out):
        lines = [orjson.loads(line) for line in shard.read_bytes().splitlines()]
        shard.write_bytes(
            b"".join(
                orjson.dumps({k: v for k, v in r.items() if k != "settings"}) + b"\n" for r in lines
            )
        )
    assert pipeline.resume(out, progress=False).written == LIMIT
    (out / "run.json").unlink()
    config = make_config([sim.url], out, run={"limit": LIMIT, "shard_size": 5})
    with pytest.raises(RunDirError, match=f"holds {LIMIT} records or failures but no run.json"):
        pipeline.generate(config, DATASET, None, progress=False)


def test_verify_reports_records_made_under_other_settings(
    sim: SimServerThread, tmp_path: Path
) -> None:
    ours = finished_run(sim, tmp_path / "ours", max_new_tokens=32)
    theirs = finished_run(sim, tmp_path / "theirs", max_new_tokens=48)
    stray = sealed_shards(theirs)[0]
    shutil.copy(stray, ours / "shards" / "shard-000099.jsonl")
    report = verify_run(ours, full=True)
    assert any(
        problem.startswith("shards/shard-000099.jsonl: 5 line(s) made under other settings")
        for problem in report.problems
    ), report.problems


def test_deleting_the_lock_file_does_not_let_a_second_process_in(tmp_path: Path) -> None:
    first = RunDir(tmp_path / "run")
    first.lock()
    try:
        (tmp_path / "run" / ".lock").unlink()
        with pytest.raises(RunDirError, match="another eagledata process is working on"):
            RunDir(tmp_path / "run").lock()
    finally:
        first.unlock()
    RunDir(tmp_path / "run").lock()  # free once the first lets go


@pytest.mark.slow
def test_deleting_the_lock_file_during_a_run_does_not_let_resume_in(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Today deleting .lock during a run let a second process in (7 duplicates)."""
    # 3 s answers, two at a time: the first run lasts a minute, longer than the second
    # process takes to start on a loaded machine (at 0.2 s the first one finished first)
    with SimServerThread(sim_config(tokenizer_dir, latency_s=3.0)) as slow:
        out = tmp_path / "run"
        config = tmp_path / "eagledata.toml"
        config.write_text(
            f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{slow.url}"]\n'
            "[generation]\nmax_new_tokens = 32\n[run]\nconcurrency = 2\n[canary]\nenabled = false\n"
        )
        first = subprocess.Popen(
            eagledata_cmd(
                "generate",
                "--config",
                str(config),
                "--dataset",
                DATASET,
                "--out",
                str(out),
                "--no-progress",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not (out / "run.json").exists():
                assert first.poll() is None, first.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.02)
            (out / ".lock").unlink()
            second = cli("resume", str(out), "--no-progress")
            assert second.returncode == 5
            assert "another eagledata process is working on" in second.stderr
        finally:
            first.kill()
            first.communicate()
    ids = [r["id"] for r in read_records(out)] + [f["id"] for f in read_failures(out)]
    assert len(ids) == len(set(ids))


def test_a_shard_written_before_fingerprints_counts_its_records_under_none(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Records written before fingerprints existed carry none: their shard's index (rebuilt from
    an older version) counts them under "", and the run still verifies."""
    out = finished_run(sim, tmp_path / "run")
    shard = sealed_shards(out)[0]
    lines = [orjson.loads(line) for line in shard.read_bytes().splitlines()]
    shard.write_bytes(
        b"".join(
            orjson.dumps({k: v for k, v in r.items() if k != "settings"}) + b"\n" for r in lines
        )
    )
    read = read_index(shard, persist=False)
    assert read.rebuilt == STALE  # the shard changed under its index
    assert read.index.settings == {"": len(lines)}
    assert verify_run(out, full=True).ok
