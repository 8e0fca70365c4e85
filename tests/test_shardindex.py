"""Shard indexes (issue 11): written with each shard, trusted only when they match it.

A generated run gets one ``shards/NAME.idx.json`` per sealed shard, equal to one rebuilt from the
shard's lines. A deleted, truncated, stale (shard changed after its index) or forged index is
detected, never trusted, and rebuilt; totals and the done set stay those of the records; a run
written before indexes existed resumes exactly once and gets its indexes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, make_config, read_failures, read_records
from eagledata.run import pipeline
from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.lines import FLAG_NAMES
from eagledata.rundir.shardindex import build_index, load_index
from eagledata.rundir.shardindex_format import (
    FORGED,
    MISSING,
    STALE,
    TORN,
    IndexRejected,
    ShardIndex,
    index_path,
)
from eagledata.rundir.status import run_status
from eagledata.rundir.totals import scan_totals, sealed_shards
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
GENERATION = {"samples_per_prompt": 2}  # 80 records in shards of 7: 12 shards


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: str) -> Path:
    from conftest import sim_config

    out = tmp_path_factory.mktemp("index") / "run"
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = make_config([sim.url], out, generation=GENERATION)
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.left == 0 and summary.written == 80
    return out


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)  # copy2: mtimes kept, so the indexes stay current
    return target


def totals_of_records(run: Path) -> dict[str, Any]:
    records = read_records(run)
    return {
        "written": len(records),
        "ids": sorted(record["id"] for record in records),
        "prompt_tokens": sum(record["prompt_tokens"] for record in records),
        "completion_tokens": sum(record["completion_tokens"] for record in records),
        "finish_reasons": dict(Counter(record["finish_reason"] for record in records)),
    }


def totals_of_indexes(run: Path) -> dict[str, Any]:
    totals = scan_totals(run)
    ids = [item_id for shard in sealed_shards(run) for item_id in load_index(shard).ids]
    return {
        "written": totals.written,
        "ids": sorted(ids),
        "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "finish_reasons": totals.finish_reasons,
    }


def test_every_sealed_shard_has_an_index_equal_to_one_rebuilt_from_its_lines(
    finished: Path,
) -> None:
    shards = sealed_shards(finished)
    assert len(shards) == 12
    sidecars = sorted((finished / "shards").glob("*.idx.json"))
    assert [index_path(shard) for shard in shards] == sidecars
    # consumers glob shards/*.jsonl: nothing but record shards may match it
    assert sorted((finished / "shards").glob("*.jsonl")) == shards
    for shard in shards:
        written = load_index(shard)  # built by the writer while it wrote the shard
        assert written == build_index(shard)
        assert written.records == len(shard.read_bytes().splitlines())
    assert totals_of_indexes(finished) == totals_of_records(finished)


def fired(record: dict[str, Any]) -> list[str]:
    """The flags a record carries, read by hand: an object of booleans, or an older list."""
    flags = record.get("flags") or ()
    if isinstance(flags, dict):
        return [name for name, value in flags.items() if value]
    return list(flags)


def test_flags_are_counted_from_the_records_and_none_for_records_without(
    finished: Path, tmp_path: Path
) -> None:
    run = copy_run(finished, tmp_path / "run")
    shard = sealed_shards(run)[0]
    records = [orjson.loads(line) for line in shard.read_bytes().splitlines()]
    assert all(set(record["flags"]) == set(FLAG_NAMES) for record in records)
    records[0]["flags"] = {**records[0]["flags"], "truncated": True, "degenerate": True}
    records[1]["flags"] = ["truncated"]  # a record written when flags were a list
    del records[2]["flags"]  # a record written before flags existed
    records[3]["flags"] = []
    records[4]["flags"] = dict.fromkeys(FLAG_NAMES, False)
    shard.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    every = read_records(run)
    expected = Counter(flag for record in every for flag in fired(record))
    totals = scan_totals(run, persist_indexes=True)
    assert totals.flags == dict(expected) and totals.flags["degenerate"] >= 1
    assert totals.flagged == sum(1 for record in every if fired(record))
    index = load_index(shard)
    assert index.flags == dict(Counter(f for r in records for f in fired(r)))
    assert index.flagged == sum(1 for record in records if fired(record))


def corrupt_deleted(index: Path, shard: Path) -> None:
    index.unlink()


def corrupt_truncated(index: Path, shard: Path) -> None:
    data = index.read_bytes()
    index.write_bytes(data[: len(data) // 2])


def corrupt_empty(index: Path, shard: Path) -> None:
    index.write_bytes(b"")


def corrupt_stale_appended(index: Path, shard: Path) -> None:
    # a record appended to the shard after its index was written
    with shard.open("ab") as handle:
        handle.write(shard.read_bytes().splitlines(keepends=True)[0].replace(b'/0"', b'/9"', 1))


def corrupt_stale_rewritten(index: Path, shard: Path) -> None:
    # same size, other content: the mtime moves
    data = bytearray(shard.read_bytes())
    data[data.index(b'"stop"') + 1 : data.index(b'"stop"') + 5] = b"STOP"
    stat = shard.stat()
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def corrupt_forged_edit(index: Path, shard: Path) -> None:
    raw = orjson.loads(index.read_bytes())
    raw["ids"] = raw["ids"][1:]  # one id dropped: resume would generate it twice
    raw["records"] -= 1
    index.write_bytes(orjson.dumps(raw))


def corrupt_forged_copy(index: Path, shard: Path) -> None:
    # another shard's (valid) index copied over this one
    other = sorted(index.parent.glob("*.idx.json"))[1]
    index.write_bytes(other.read_bytes())


CORRUPTIONS = {
    "deleted": (corrupt_deleted, MISSING),
    "truncated": (corrupt_truncated, TORN),
    "empty": (corrupt_empty, TORN),
    "stale-appended": (corrupt_stale_appended, STALE),
    "stale-rewritten": (corrupt_stale_rewritten, STALE),
    "forged-edit": (corrupt_forged_edit, FORGED),
    "forged-copy": (corrupt_forged_copy, FORGED),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_bad_index_is_detected_and_rebuilt_never_trusted(
    finished: Path, tmp_path: Path, name: str
) -> None:
    run = copy_run(finished, tmp_path / "run")
    shard = sealed_shards(run)[0]
    corrupt, kind = CORRUPTIONS[name]
    corrupt(index_path(shard), shard)
    expected = totals_of_records(run)  # the records are the truth, whatever the index says

    with pytest.raises(IndexRejected) as rejected:
        load_index(shard)
    assert rejected.value.kind == kind

    on_disk = index_path(shard).read_bytes() if index_path(shard).exists() else None
    assert scan_totals(run).indexes_rebuilt == {kind: 1}  # a reader rebuilds it in memory...
    assert (index_path(shard).read_bytes() if index_path(shard).exists() else None) == on_disk
    totals = scan_totals(run, persist_indexes=True)  # ...the lock holder (resume) writes it
    assert totals.indexes_rebuilt == {kind: 1}
    assert totals.written == expected["written"]
    assert totals.prompt_tokens == expected["prompt_tokens"]
    assert totals.completion_tokens == expected["completion_tokens"]
    assert totals.finish_reasons == expected["finish_reasons"]
    assert len(totals.done_ids) == len(set(expected["ids"])) + len(read_failures(run))
    assert all(item_id in totals.done_ids for item_id in expected["ids"])
    # rebuilt and written back: the next reader trusts it
    assert load_index(shard) == build_index(shard)
    assert scan_totals(run).indexes_rebuilt == {}


def test_a_copy_with_new_mtimes_keeps_its_indexes(finished: Path, tmp_path: Path) -> None:
    """``cp -r`` (no -p) gives every shard a new mtime: the same bytes are the same shard, so
    no index is stale; the lock holder records the new mtimes, and a changed byte is still
    caught (stale-rewritten above keeps the size too)."""
    run = tmp_path / "copied"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True, timeout=120)
    shards = sealed_shards(run)
    later = time.time_ns() + 5_000_000_000
    for shard in shards:  # as a copy made a few seconds later would have them
        os.utime(shard, ns=(later, later))
    assert [load_index(shard) for shard in shards] == [build_index(shard) for shard in shards]
    assert scan_totals(run).indexes_rebuilt == {}
    assert scan_totals(run, persist_indexes=True).indexes_rebuilt == {}
    recorded = [orjson.loads(index_path(shard).read_bytes())["mtime_ns"] for shard in shards]
    assert recorded == [later] * len(shards)


@pytest.mark.parametrize("name", ["deleted", "truncated", "stale-rewritten", "forged-edit"])
def test_verify_notes_a_rebuilt_index_and_checks_that_shard_line_by_line(
    finished: Path, tmp_path: Path, name: str
) -> None:
    run = copy_run(finished, tmp_path / "run")
    shard = sealed_shards(run)[0]
    corrupt, kind = CORRUPTIONS[name]
    corrupt(index_path(shard), shard)
    files = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    report = verify_run(run)
    note = (
        f"rebuilt 1 shard index(es) from their shard, {kind}: {shard.name} "
        "('eagledata resume' writes them back)"
    )
    assert note in report.notes
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == files
    if name == "stale-rewritten":  # the shard itself changed: its lines are checked
        # The first "stop" is the first record's unless that one hit its length limit: which
        # record a shard starts with depends on which answer came back first.
        data = shard.read_bytes()
        line = data[: data.index(b'"STOP"')].count(b"\n") + 1
        assert report.problems == [
            f"shards/shard-000000.jsonl:{line}: not a record "
            "(finish_reason: Input should be 'stop' or 'length'); run 'eagledata verify "
            f"{run} --repair' to move it aside"
        ]
    else:
        assert report.ok, report.problems


def forge_with_a_fresh_digest(shard: Path) -> None:
    """An index rewritten consistently (digest, counts) but wrong: only a full read finds it."""
    index = load_index(shard)
    forged = ShardIndex(**{**vars(index), "ids": [index.ids[0], *index.ids[:-1]]})
    index_path(shard).write_bytes(forged.to_bytes())
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_verify_full_reads_every_line_and_finds_a_consistently_forged_index(
    finished: Path, tmp_path: Path
) -> None:
    run = copy_run(finished, tmp_path / "run")
    shard = sealed_shards(run)[3]
    forge_with_a_fresh_digest(shard)
    quick = verify_run(run)  # trusts the index: sees a repeated id, not the one it dropped
    assert not quick.ok
    full = verify_run(run, full=True)
    assert full.records == 80
    assert full.problems == [
        f"shards/{shard.name}: its index differs from the shard (ids); delete "
        f"shards/{index_path(shard).name} and run 'eagledata resume {run}' to rebuild it"
    ]
    index_path(shard).unlink()  # the fix it names
    scan_totals(run, persist_indexes=True)  # what resume does first
    assert verify_run(run).ok and verify_run(run, full=True).ok


def test_a_run_written_before_indexes_resumes_exactly_once(
    finished: Path, tmp_path: Path, sim: SimServerThread
) -> None:
    run = copy_run(finished, tmp_path / "run")
    for sidecar in (run / "shards").glob("*.idx.json"):
        sidecar.unlink()
    lost = sealed_shards(run)[-1]
    lost_ids = {orjson.loads(line)["id"] for line in lost.read_bytes().splitlines()}
    lost.unlink()  # work the old run had not done yet

    summary = pipeline.resume(run, server_urls=[sim.url], progress=False)
    assert summary.session_records == len(lost_ids)
    assert summary.left == 0
    ids = [record["id"] for record in read_records(run)]
    assert len(ids) == len(set(ids)) == 80
    assert lost_ids <= set(ids)
    for shard in sealed_shards(run):
        assert load_index(shard) == build_index(shard)
    assert verify_run(run, full=True).ok


def test_status_reads_indexes_not_records(finished: Path, tmp_path: Path) -> None:
    run = copy_run(finished, tmp_path / "run")

    def counts(report: Any) -> Any:  # the rates depend on the clock
        return replace(report, recent=None)

    expected = counts(run_status(run))
    # make every record unreadable without changing the shards' sizes or mtimes: a status that
    # read the lines would fail; one that reads the trusted indexes gives the same numbers
    for shard in sealed_shards(run):
        stat = shard.stat()
        shard.write_bytes(b"x" * stat.st_size)
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert counts(run_status(run)) == expected


def test_the_compact_id_set_is_a_set() -> None:
    ids = [f"sharegpt/row-{index}/{index % 3}" for index in range(5000)]
    compact = CompactIdSet(ids[:3000], buffer_size=256)
    for item_id in ids[2500:]:  # repeats and new ids, across several merges
        compact.add(item_id)
    assert len(compact) == 5000
    assert all(item_id in compact for item_id in ids)
    assert not any(f"other/{index}/0" in compact for index in range(5000))
    assert compact.nbytes == 16 * 5000


def test_resuming_a_finished_run_reads_no_record_no_row_and_no_tokenizer(
    finished: Path, tmp_path: Path, sim: SimServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagledata.source import mix
    from eagledata.source.tokenization import PromptTokenizer

    run = copy_run(finished, tmp_path / "run")

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished run needs no tokenizer and no dataset rows")

    monkeypatch.setattr(PromptTokenizer, "__init__", forbidden)
    monkeypatch.setattr(mix, "iter_rows", forbidden)
    monkeypatch.setattr("eagledata.rundir.shardindex.build_index", forbidden)  # indexes only
    summary = pipeline.resume(run, server_urls=[sim.url], progress=False)
    assert (summary.planned, summary.written, summary.left) == (80, 80, 0)
    assert summary.session_records == 0


def test_speculative_counts_and_time_span_come_through_the_index(
    finished: Path, tmp_path: Path
) -> None:
    run = copy_run(finished, tmp_path / "run")
    for number, shard in enumerate(sealed_shards(run)):
        records = [orjson.loads(line) for line in shard.read_bytes().splitlines()]
        for position, record in enumerate(records):
            if (number + position) % 3:  # some records were speculatively decoded
                record["spec_verify_ct"] = max(1, record["completion_tokens"] // 3)
        shard.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    every = read_records(run)
    speculative = [r for r in every if r.get("spec_verify_ct")]
    totals = scan_totals(run)
    assert totals.acceptance.records == len(speculative)
    assert totals.acceptance.tokens == sum(r["completion_tokens"] for r in speculative)
    assert totals.acceptance.verify_ct == sum(r["spec_verify_ct"] for r in speculative)
    created = [r["created_at"] for r in every]
    assert totals.first_created == pytest.approx(min(created), abs=1e-3)
    assert totals.last_created == pytest.approx(max(created), abs=1e-3)
