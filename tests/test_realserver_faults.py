"""Faults against the real SGLang 0.5.23 on this CPU (the ``realserver`` tier): the client killed,
the server killed and restarted, a request given up on, retraction under a small pool, two
servers behind the real sglang-router.

Every check reads the server's own request log (what it was asked, what it answered, by rid)
or its own ``/metrics``, never eagledata's account alone. One server for the module, serving
the trained model with a small KV pool (1,024 tokens at ``--schedule-conservativeness 0.1``:
SGLang admits more than the pool holds and retracts, so every test here runs under retraction
pressure); the router test starts a second one.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conftest import read_failures, read_records
from realrun import (
    SHAREGPT_ROWS,
    TRAINED_MODEL,
    assert_as_logged,
    assert_exactly_once,
    generate_args,
    kill_group,
    metric,
    run_cli,
    start_cli,
    write_config,
)
from realserver import RequestLog, env, serve

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(1800)]

POOL_TOKENS = 1024
SMALL_POOL = ("--schedule-conservativeness", "0.1")
RETRACTED = "sglang:num_retracted_requests_total"
ROWS = 16  # of the bundled ShareGPT sample's 40
# The kill tests: long enough a run that a kill at its first record lands mid-run.
KILL_ROWS = SHAREGPT_ROWS
KILL_TOKENS = 64
MAX_NEW_TOKENS = 2048  # the request given up on: far longer than its deadline allows


@pytest.fixture(scope="module")
def real_server(sglang_cpu_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("server-small-pool")
    with serve(
        sglang_cpu_venv, TRAINED_MODEL, workdir, max_total_tokens=POOL_TOKENS,
        extra_flags=SMALL_POOL,
    ) as server:  # fmt: skip
        print(f"real server ready in {server.ready_seconds:.0f} s", file=sys.stderr)
        yield server


def rids_of(log: RequestLog) -> set[str]:
    return set(log.received())


def test_kill_9_of_the_client_then_resume_writes_every_row_once(
    real_server: Any, tmp_path: Path
) -> None:
    """The client is SIGKILLed mid-run (by the server's account: 10 of the run's 40 answers
    finished, requests in flight); ``resume`` finishes the run: every row once, each record
    exactly what the server logged for its rid. A check of the server every second lets the
    answers land as records while the run goes on (they land after a check passes)."""
    out = tmp_path / "run"
    config = write_config(
        tmp_path / "real.toml", [real_server.url], out, max_new_tokens=KILL_TOKENS, concurrency=4,
        server="guard_interval_s = 1",
    )  # fmt: skip
    before = rids_of(RequestLog.read(real_server.request_log_dir))
    started = time.monotonic()
    client = start_cli(*generate_args(config), log=tmp_path / "generate.log")
    try:
        deadline = time.monotonic() + 300
        while len(answered(real_server, before)) < 10:
            assert client.poll() is None and time.monotonic() < deadline, "no answers"
            time.sleep(0.1)
    finally:
        kill_group(client)
    answered_at_kill = answered(real_server, before)
    written_at_kill = len(read_records(out))
    print(
        f"killed after {time.monotonic() - started:.0f} s: {len(answered_at_kill)} answered, "
        f"{written_at_kill} written",
        file=sys.stderr,
    )
    assert len(answered_at_kill) < KILL_ROWS, "the run ended before the kill: nothing was tested"
    started = time.monotonic()
    resumed = run_cli("resume", str(out), "--no-progress")
    print(f"resumed in {time.monotonic() - started:.0f} s: {resumed.stdout}", file=sys.stderr)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    records = assert_exactly_once(out, KILL_ROWS)
    assert len(records) > written_at_kill
    assert_as_logged(records, RequestLog.read(real_server.request_log_dir))


def test_a_request_given_up_on_is_aborted_on_the_server(real_server: Any, tmp_path: Path) -> None:
    """A whole-request deadline far shorter than the answers: eagledata gives up on requests,
    and each one it gave up on ends on the server as an abort (its request log), not as an
    answer generated to the end for nobody; or, the race it cannot win, it ended on its own at
    the deadline, before the abort reached the server."""
    before = rids_of(RequestLog.read(real_server.request_log_dir))
    out = tmp_path / "run"
    config = write_config(
        tmp_path / "real.toml", [real_server.url], out, max_new_tokens=MAX_NEW_TOKENS,
        concurrency=4,
        server="request_timeout_s = 0.4\nmax_attempts = 2\nbackoff_base_s = 0.1",
    )  # fmt: skip
    result = run_cli(*generate_args(config, "--limit", "4"))
    output = result.stdout + result.stderr
    # 7: every item failed (each one timed out, which is the point)
    assert result.returncode in (0, 1, 7), output
    assert {f["reason"] for f in read_failures(out)} <= {"timeout"}, read_failures(out)
    records = {record["rid"] for record in read_records(out)}
    # the server may log an abort a moment after the client moved on
    deadline = time.monotonic() + 30
    while True:
        log = RequestLog.read(real_server.request_log_dir)
        # the run's generation requests (not the KV guard's one-token probes, nor SGLang's own
        # health checks) that left no record
        given_up = {
            rid
            for rid, event in log.received().items()
            if rid not in before and rid not in records
            and event["obj"].get("sampling_params", {}).get("max_new_tokens") == MAX_NEW_TOKENS
        }  # fmt: skip
        finished = log.finished()
        if all(rid in finished for rid in given_up) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert given_up, f"no request timed out at 0.4 s: nothing was tested\n{output}"
    unfinished = given_up - set(finished)
    assert not unfinished, f"still generating on the server 30 s after the run: {unfinished}"
    reasons = {rid: finished[rid]["out"]["meta_info"]["finish_reason"] for rid in given_up}
    print(f"{len(given_up)} requests given up on; finish reasons: {reasons}", file=sys.stderr)
    aborted = {rid for rid, reason in reasons.items() if (reason or {}).get("type") == "abort"}
    assert aborted, reasons
    # One that ended on its own as the client gave up (the abort came after its last token)
    # ran for the whole deadline; one that ended sooner would have been answered, not given up.
    latency = {rid: finished[rid]["out"]["meta_info"].get("e2e_latency") for rid in given_up}
    raced = {rid: latency[rid] for rid in given_up - aborted}
    assert all(seconds is not None and seconds >= 0.3 for seconds in raced.values()), {
        rid: (reasons[rid], raced[rid]) for rid in raced
    }


def test_retractions_in_telemetry_are_the_servers(real_server: Any, tmp_path: Path) -> None:
    """Eighty concurrent requests without ``ignore_eos`` on a 1,024-token pool: SGLang retracts.
    The records stay exactly what the server logged, and the retractions the run's telemetry
    records (``num_retracted_requests_total``, the server's counter as eagledata read it) grew
    by what the server's ``/metrics`` counter grew, which its request log confirms request by
    request (``num_retractions``). Whether SGLang retracts is its own admission's call, which
    the timing of arrivals moves: on a loaded machine the client's requests reach the server
    more spread out and one round of this load retracted nothing (1 of 3 runs of the suite
    under `stress-ng`), so the same round runs again, up to three times, until one retracts;
    every round's counts must agree, retraction or not."""
    # Run after the module's other tests on purpose: on a fresh server SGLang admits cautiously
    # (its new-token ratio decays as requests finish) and the same load retracted nothing.
    rounds = []
    for attempt in range(3):
        counter_before = metric(real_server.url, RETRACTED)
        before = rids_of(RequestLog.read(real_server.request_log_dir))
        out = tmp_path / f"run-{attempt}"
        config = write_config(
            tmp_path / f"real-{attempt}.toml", [real_server.url], out, max_new_tokens=256,
            samples=4, concurrency=80,
        )  # fmt: skip
        result = run_cli(*generate_args(config, "--limit", "20"))
        assert result.returncode == 0, result.stdout + result.stderr
        records = assert_exactly_once(out, 20, samples=4)
        log = RequestLog.read(real_server.request_log_dir)
        assert_as_logged(records, log)
        finished = log.finished()
        ours = rids_of(log) - before
        logged = sum(finished[rid]["out"]["meta_info"].get("num_retractions") or 0 for rid in ours)
        counted = metric(real_server.url, RETRACTED) - counter_before
        lines = [orjson.loads(line) for line in (out / "telemetry.jsonl").read_bytes().splitlines()]
        seen = [line["num_retracted_requests_total"] for line in lines]
        print(
            f"round {attempt}: retractions: server counter +{counted:g}, request log {logged}, "
            f"telemetry {seen[-1]} (from {counter_before:g}), controller back-offs "
            f"{lines[-1]['num_retracted_reqs']}",
            file=sys.stderr,
        )
        assert logged == counted
        if counted:
            assert seen[-1] is not None and seen[-1] - counter_before == counted, seen
            assert 1 <= lines[-1]["num_retracted_reqs"] <= counted
        rounds.append(counted)
        if counted:
            break
    assert any(rounds), f"no retraction on a 1,024-token pool in {len(rounds)} rounds: untested"


def test_a_server_killed_and_restarted_mid_run_finishes_once(
    real_server: Any, tmp_path: Path
) -> None:
    """The server's whole process group is SIGKILLed mid-run and started again on the same
    port: the run waits (``[server] down_deadline_s``), reconnects, re-checks the server and
    finishes, every row once, each record what the server (before or after) logged."""
    out = tmp_path / "run"
    config = write_config(
        tmp_path / "real.toml", [real_server.url], out, max_new_tokens=KILL_TOKENS, concurrency=2,
        server="down_deadline_s = 400\nbackoff_base_s = 0.2\nbackoff_max_s = 2",
    )  # fmt: skip
    before = rids_of(RequestLog.read(real_server.request_log_dir))
    client = start_cli(*generate_args(config), log=tmp_path / "generate.log")
    try:
        # mid-run by the server's own account: some of the run's answers finished, not all (the
        # run's records land in bulk, after a check of the server, so they cannot tell)
        deadline = time.monotonic() + 300
        while len(answered(real_server, before)) < 6:
            assert client.poll() is None and time.monotonic() < deadline, "no answers"
            time.sleep(0.2)
        os.killpg(real_server.process.pid, signal.SIGKILL)
        real_server.process.wait(timeout=30)
        answered_before_kill = answered(real_server, before)
        real_server.start()
        print(
            f"killed after {len(answered_before_kill)} answers; restarted in "
            f"{real_server.ready_seconds:.0f} s",
            file=sys.stderr,
        )
        code = client.wait(timeout=600)
    finally:
        if client.poll() is None:
            kill_group(client)
    output = (tmp_path / "generate.log").read_text()
    assert code == 0, output
    assert len(answered_before_kill) < KILL_ROWS, "the run ended before the kill: nothing tested"
    records = assert_exactly_once(out, KILL_ROWS)
    assert_as_logged(records, RequestLog.read(real_server.request_log_dir))
    after = [r for r in records if r["rid"] not in answered_before_kill]
    assert after, "no record was answered by the restarted server"


def answered(server: Any, before: set[str]) -> set[str]:
    """The rids of the run's generation requests (``KILL_TOKENS`` new tokens: not the KV
    guard's one-token probes) that the server logged as finished."""
    log = RequestLog.read(server.request_log_dir)
    asked = {
        rid
        for rid, event in log.received().items()
        if rid not in before
        and event["obj"].get("sampling_params", {}).get("max_new_tokens") == KILL_TOKENS
    }
    return asked & set(log.finished())


def test_two_real_servers_behind_the_real_router(
    real_server: Any, sglang_cpu_venv: Path, tmp_path: Path
) -> None:
    """Two real servers behind the real sglang-router (round robin): every row once, each
    record in one server's request log with its ids, and each server answered some."""
    pytest.importorskip("sglang_router", reason="sglang-router is not installed")
    with (
        serve(
            sglang_cpu_venv, TRAINED_MODEL, tmp_path / "second", max_total_tokens=POOL_TOKENS,
            extra_flags=SMALL_POOL,
        ) as second,
        router([real_server.url, second.url], tmp_path) as url,
    ):  # fmt: skip
        out = tmp_path / "run"
        config = write_config(tmp_path / "real.toml", [url], out, max_new_tokens=32)
        result = run_cli(*generate_args(config, "--limit", str(ROWS)))
        assert result.returncode == 0, result.stdout + result.stderr
        records = assert_exactly_once(out, ROWS)
        logs = [RequestLog.read(s.request_log_dir) for s in (real_server, second)]
    served = collections.Counter()
    for record in records:
        holders = [log for log in logs if record["rid"] in log.finished()]
        assert len(holders) == 1, f"{record['rid']} is in {len(holders)} servers' logs"
        assert_as_logged([record], holders[0])
        served[logs.index(holders[0])] += 1
    print(f"records per server: {dict(served)}", file=sys.stderr)
    assert served[0] > 0 and served[1] > 0, served


class router:
    """The real sglang-router (``sglang_router.launch_router``) in front of ``workers``."""

    def __init__(self, workers: list[str], tmp_path: Path) -> None:
        self.workers = workers
        self.log_path = tmp_path / "router.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        port = env.free_port()
        cmd = [
            sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *self.workers,
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(env.free_port()), "--policy", "round_robin",
            "--log-level", "warn",
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                ready = httpx.get(url + "/readiness", timeout=2).json()
                if ready.get("healthy_workers") == len(self.workers):
                    return url
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, "the router did not come up"
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
