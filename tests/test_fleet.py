"""Issue 26, a fleet: ``launch-server --router URL...`` starts the real sglang-router in front of
running servers (simulated here), checks every worker's KV cache and refuses an fp8 one by name;
``generate --server ROUTER_URL`` then runs one job over the workers, its KV guard and its canary
checking each worker directly, not the router's answer.

Each test starts the router as a user does (``eagledata launch-server --router``, a subprocess)
and stops it as a user does (Ctrl-C: SIGINT), and checks that nothing is left listening.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, eagledata_cmd, make_config, read_records, sim_config
from eagledata.errors import CanaryDriftError, ServerRefusedError
from eagledata.run import pipeline
from eagledata.rundir.verify import verify_run
from eagledata.server.verdict import REFUSAL_FIX
from eagledata.simserver import SimServerThread

pytest.importorskip(
    "sglang_router", reason="sglang-router is not installed (pip install sglang-router==0.3.2)"
)

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
EXIT_INTERRUPTED = 130
CANARY = {
    "enabled": True,
    "prompts": 6,
    "reference_tokens": 48,
    "probes": 3,
    "probe_tokens": 24,
    "top_logprobs": 5,
    "baseline_idle_runs": 3,
    "baseline_load_runs": 2,
    "load_requests": 4,
    "period_s": 0.3,
}


def free_port() -> int:
    """A port nothing listens on now. The router's Prometheus exporter gets one of its own
    (``launch_router_cli``), not launch-server's PORT + 1: ``bind(0)`` hands out odd ports and
    Linux gives outgoing connections even ones, so under load PORT + 1 is often some client's."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Lines:
    """A subprocess's stdout, line by line, read in a thread: waits have a bound."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None
        stream = process.stdout
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, prefix: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no line starting {prefix!r}; saw {self.seen}"
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, f"ended before {prefix!r}; saw {self.seen}"
            self.seen.append(line)
            if line.startswith(prefix):
                return line


def launch_router_cli(workers: list[SimServerThread], port: int) -> subprocess.Popen[str]:
    args = ["launch-server", "--deadline", "60", "--router-port", str(port)]
    for worker in workers:
        args += ["--router", worker.url]
    # the router notices a dead or changed worker within a second (default: every 60 s)
    args += ["--", "--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
    args += ["--prometheus-port", str(free_port())]
    return subprocess.Popen(
        eagledata_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@contextmanager
def launched_router(
    workers: list[SimServerThread], stop: signal.Signals = signal.SIGINT
) -> Iterator[str]:
    """``eagledata launch-server --router`` over ``workers``, until Ctrl-C (or ``stop``); its
    URL."""
    port = free_port()
    process = launch_router_cli(workers, port)
    lines = Lines(process)
    try:
        ready = lines.wait_for("router ready at ")
        url = f"http://127.0.0.1:{port}"
        assert ready.startswith(f"router ready at {url} over {len(workers)} workers, each checked")
        verdicts = {
            line.split(": ", 1)[0].removeprefix("worker "): line.split(": ", 1)[1]
            for line in lines.seen[:-1]
        }
        assert set(verdicts) == {worker.url for worker in workers}
        assert all(verdict.startswith("bf16 KV ok") for verdict in verdicts.values())
        yield url
    finally:
        process.send_signal(stop)  # Ctrl-C, or SLURM's TERM: the router is stopped with it
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    assert code == EXIT_INTERRUPTED, process.stderr.read() if process.stderr else ""
    assert not listening(port), "the router outlived launch-server"


@pytest.fixture
def two_workers(tokenizer_dir: str) -> Iterator[list[SimServerThread]]:
    with (
        SimServerThread(sim_config(tokenizer_dir, latency_s=0.03)) as first,
        SimServerThread(sim_config(tokenizer_dir, latency_s=0.03)) as second,
    ):
        yield [first, second]


def quality(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "quality.jsonl").read_bytes().splitlines()]


def checks(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "checks.jsonl").read_bytes().splitlines()]


def test_launch_server_router_refuses_an_fp8_worker_by_name(tokenizer_dir: str) -> None:
    with (
        SimServerThread(sim_config(tokenizer_dir)) as good,
        SimServerThread(sim_config(tokenizer_dir, kv_cache_dtype="fp8_e4m3")) as bad,
    ):
        port = free_port()
        process = launch_router_cli([good, bad], port)
        out, err = process.communicate(timeout=120)
        assert not listening(port), "a refused fleet's router must not be left running"
        served = good.stats()["requests"] + bad.stats()["requests"]
    assert process.returncode == 4, err
    url = f"http://127.0.0.1:{port}"
    refusals = [line for line in err.splitlines() if line.startswith("eagledata: error: ")]
    assert refusals == [
        f"eagledata: error: {bad.url} (behind the router {url}) refused: kv_cache_dtype is "
        "'fp8_e4m3', not bf16. Fix: relaunch it with --kv-cache-dtype bf16 (eagledata "
        "launch-server), or leave it out of --router"
    ]
    assert "router ready" not in out
    assert served == 0  # checked by its /server_info; nothing generated


@pytest.mark.slow
def test_one_job_over_the_fleet_checks_every_worker_with_the_guard_and_the_canary(
    two_workers: list[SimServerThread], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with launched_router(two_workers) as url:
        config = make_config(
            [url], out, generation={"samples_per_prompt": 2, "temperature": 0.7}, canary=CANARY
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.written == 80 and summary.left == 0
    assert all(worker.stats()["requests"] >= 30 for worker in two_workers)
    assert verify_run(out).ok
    workers = {worker.url for worker in two_workers}
    # the KV guard read each worker's own /server_info, through the router's list of workers
    assert {(c["server"], c["via"]) for c in checks(out)} == {(w, url) for w in workers}
    # the canary: the baseline on one worker, then every check on each worker directly
    lines = quality(out)
    baseline = {line["server"] for line in lines if line["kind"] == "baseline"}
    assert len(baseline) == 1 and baseline <= workers
    scored = [line for line in lines if line["kind"] == "check"]
    assert {(line["server"], line["via"]) for line in scored} == {(w, url) for w in workers}
    for trigger in ("start", "end"):
        assert {line["server"] for line in scored if line["trigger"] == trigger} == workers
    assert all(line["verdict"] == "pass" and line["cold"] == 0 for line in scored)


@pytest.mark.slow
def test_a_worker_switched_to_fp8_behind_the_fleet_is_refused_by_name(
    two_workers: list[SimServerThread], tmp_path: Path
) -> None:
    first, second = two_workers
    with launched_router(two_workers) as url:
        second.control(kv_cache_dtype="fp8_e4m3")  # after launch-server checked it
        with pytest.raises(ServerRefusedError) as caught:
            pipeline.generate(make_config([url], tmp_path / "run"), DATASET, None, progress=False)
    assert str(caught.value) == (
        f"{second.url} (behind the router {url}) refused: kv_cache_dtype is 'fp8_e4m3', not bf16. "
        f"Fix: {REFUSAL_FIX}"
    )
    assert first.stats()["requests"] == second.stats()["requests"] == 0
    assert not read_records(tmp_path / "run")


@pytest.mark.slow
def test_a_worker_degraded_behind_the_fleet_is_caught_by_the_canary_by_name(
    two_workers: list[SimServerThread], tmp_path: Path
) -> None:
    """Still bf16 everywhere it reports: only the canary, scoring that worker itself, sees it."""
    second = two_workers[1]
    out = tmp_path / "run"
    with launched_router(two_workers) as url:
        config = make_config(
            [url],
            out,
            generation={"samples_per_prompt": 4, "temperature": 0.7},
            server={"guard_interval_s": 0.1, "guard_max_held": 1000},
            run={"concurrency": 4},
            canary=CANARY,
        )
        switched = threading.Event()

        def degrade_after_some_work() -> None:
            deadline = time.monotonic() + 60
            while len(read_records(out)) < 10 and time.monotonic() < deadline:
                time.sleep(0.005)
            second.control(degraded=True)
            switched.set()

        threading.Thread(target=degrade_after_some_work, daemon=True).start()
        with pytest.raises(CanaryDriftError) as caught:
            pipeline.generate(config, DATASET, None, progress=False)
    assert switched.is_set()
    message = str(caught.value)
    assert message.startswith(
        f"{second.url} (behind the router {url}) drifted from the canary baseline: "
    ), message
    degraded = set(second.stats()["answers"]["degraded"])
    assert degraded, "the degraded worker did answer"
    records = read_records(out)
    assert records and not degraded & {r["rid"] for r in records}
    last = quality(out)[-1]
    assert (last["server"], last["via"], last["verdict"]) == (second.url, url, "drift")


@pytest.mark.slow
def test_a_term_to_launch_server_stops_its_router(two_workers: list[SimServerThread]) -> None:
    """What scancel and the end of a SLURM job send: the router must not outlive it (the
    context manager checks its port is closed)."""
    with launched_router(two_workers, stop=signal.SIGTERM) as url:
        assert url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("taken", ["router", "exporter"])
def test_a_router_port_already_taken_is_one_line_naming_the_fix(
    two_workers: list[SimServerThread], taken: str
) -> None:
    """A port in use would make sglang-router panic with a stack trace; launch-server says
    which port and what to pass instead, before it starts anything."""
    with socket.socket() as holder:
        while True:  # PORT + 1 may be some client's at this moment (free_port says why): next
            port = free_port()
            try:
                holder.bind(("127.0.0.1", port if taken == "router" else port + 1))
                break
            except OSError:
                continue
        holder.listen()
        args = ["launch-server", "--router-port", str(port)]
        for worker in two_workers:
            args += ["--router", worker.url]
        done = subprocess.run(eagledata_cmd(*args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 6, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    wanted = port if taken == "router" else port + 1
    assert f"port {wanted} " in line and "already in use" in line
    assert "--router-port" in line and "--prometheus-port" in line
