"""Issue 3, item 3: generation behind the real sglang-router, the bf16 guard not weakened.

What sglang-router 0.3.2 does with the routes eagledata needs (checked below, so a router upgrade
that changes it shows up here):

* ``POST /generate`` is forwarded to one worker, ``rid``, ``input_ids`` and every sampling
  parameter eagledata sends intact; a client disconnect is passed on to the worker.
* ``GET /health`` answers 200 ``OK`` whatever its workers do (even all dead).
* ``GET /server_info`` is 404 and ``GET /get_server_info`` describes the router
  (``{"router_manager": true, "workers_count": N}``), not a worker: no ``kv_cache_dtype``, no
  ``internal_states``.
* ``POST /abort_request`` is 404.
* ``GET /workers`` lists every worker's URL and the router's view of its health.

So the guard checks a router through its workers, each read directly (``KVGuard.check``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conftest import SAMPLES, make_config, read_failures, read_records, sim_config
from eagledata.errors import ServerRefusedError
from eagledata.run import pipeline
from eagledata.rundir.verify import verify_run
from eagledata.server.verdict import REFUSAL_FIX
from eagledata.simserver import SimServerThread, expected_output

pytestmark = pytest.mark.slow  # a real sglang-router in front of simulated workers

pytest.importorskip(
    "sglang_router", reason="sglang-router is not installed (pip install sglang-router==0.3.2)"
)

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def router(workers: list[SimServerThread], tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / f"router-{port}.log").open("wb")
    cmd = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--worker-urls", *(w.url for w in workers),
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--policy", "round_robin", "--log-level", "warn",
        # notice a dead worker within about a second (default: every 60 s), and close the
        # circuit the router opens on a dead worker after a second too (default: 60 s)
        "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
        "--cb-timeout-duration-secs", "1",
    ]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / f"router-{port}.log").read_text()
            try:
                ready = httpx.get(url + "/readiness", timeout=1).json()
                if ready.get("healthy_workers") == len(workers):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, "the router did not come up"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture
def two_workers(tokenizer_dir: str) -> Iterator[list[SimServerThread]]:
    with (
        SimServerThread(sim_config(tokenizer_dir, latency_s=0.02)) as first,
        SimServerThread(sim_config(tokenizer_dir, latency_s=0.02)) as second,
    ):
        yield [first, second]


class Background:
    """``pipeline.generate`` in a thread, so a test can break a worker while it runs."""

    def __init__(self, action: Callable[[], Any]) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._target, args=(action,), daemon=True)
        self._thread.start()

    def _target(self, action: Callable[[], Any]) -> None:
        try:
            action()
        except BaseException as exc:  # handed to the test by join()
            self.error = exc

    def join(self, timeout: float = 60) -> BaseException | None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the run did not end"
        return self.error


def wait_for_records(out: Path, count: int) -> None:
    deadline = time.monotonic() + 60  # generous: a few seconds on a busy machine
    while not (out / "shards").is_dir() or len(read_records(out)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} records"
        time.sleep(0.01)


def wait_for_healthy_workers(url: str, count: int) -> None:
    """Until the router itself (``GET /workers``) marks ``count`` workers healthy."""
    deadline = time.monotonic() + 60  # generous: its health check runs every second
    while True:
        try:
            workers = httpx.get(url + "/workers", timeout=5).json()["workers"]
            if sum(1 for worker in workers if worker.get("is_healthy")) == count:
                return
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        assert time.monotonic() < deadline, f"the router never counted {count} healthy workers"
        time.sleep(0.05)


def checks(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "checks.jsonl").read_bytes().splitlines()]


def assert_faithful(out: Path, config: Any, worker: SimServerThread, prompt_tokenizer: Any) -> None:
    params = config.generation.sampling_params()
    for record in read_records(out):
        assert record["input_ids"] == prompt_tokenizer.encode(record["messages"])
        output, finish = expected_output(
            record["input_ids"], {**params, "sampling_seed": record["sample"]}, worker.config
        )
        assert record["output_ids"] == output, record["id"]
        assert record["finish_reason"] == finish["type"]


def test_what_the_router_forwards(two_workers: list[SimServerThread], tmp_path: Path) -> None:
    fresh = httpx.Limits(max_keepalive_connections=0)  # one connection a request
    with (
        router(two_workers, tmp_path) as url,
        httpx.Client(base_url=url, timeout=10, limits=fresh) as http,
    ):
        assert http.get("/health").status_code == 200
        assert http.get("/server_info").status_code == 404
        info = http.get("/get_server_info").json()
        assert "kv_cache_dtype" not in info and "internal_states" not in info
        assert http.post("/abort_request", json={"rid": "x"}).status_code == 404
        listed = {w["url"] for w in http.get("/workers").json()["workers"]}
        assert listed == {w.url for w in two_workers}
        rid = "eagledata-" + "ab" * 16
        params = {
            "max_new_tokens": 9,
            "temperature": 0.7,
            "top_p": 0.95,
            "top_k": -1,
            "min_p": 0.0,
            "sampling_seed": 3,
        }
        item = http.post(
            "/generate", json={"input_ids": [5, 6, 7], "sampling_params": params, "rid": rid}
        ).json()
    assert item["meta_info"]["id"] == rid
    assert (item["output_ids"], item["meta_info"]["finish_reason"]) == expected_output(
        [5, 6, 7], params, two_workers[0].config
    )


def test_generate_behind_the_router_checks_every_worker(
    two_workers: list[SimServerThread], prompt_tokenizer: Any, tmp_path: Path
) -> None:
    with router(two_workers, tmp_path) as url:
        out = tmp_path / "run"
        config = make_config([url], out, generation={"samples_per_prompt": 2, "temperature": 0.7})
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.written == 80 and summary.left == 0
    assert_faithful(out, config, two_workers[0], prompt_tokenizer)
    assert {r["server"] for r in read_records(out)} == {url}
    assert all(w.stats()["requests"] >= 30 for w in two_workers)  # round robin
    logged = checks(out)
    assert {(c["server"], c["via"]) for c in logged} == {(w.url, url) for w in two_workers}
    assert all(c["ok"] and c["internal_kv_dtypes"] == ["bf16"] for c in logged)
    facts = orjson.loads((out / "run.json").read_bytes())["server_facts"]
    assert set(facts) == {url, *(w.url for w in two_workers)}
    assert verify_run(out).ok


def test_one_fp8_worker_behind_the_router_refuses_the_run(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    with (
        SimServerThread(sim_config(tokenizer_dir)) as good,
        SimServerThread(sim_config(tokenizer_dir, kv_cache_dtype="fp8_e4m3")) as bad,
        router([good, bad], tmp_path) as url,
    ):
        out = tmp_path / "run"
        with pytest.raises(ServerRefusedError) as caught:
            pipeline.generate(make_config([url], out), DATASET, None, progress=False)
        assert bad.stats()["requests"] == good.stats()["requests"] == 0
    assert str(caught.value) == (
        f"{bad.url} (behind the router {url}) refused: kv_cache_dtype is 'fp8_e4m3', not bf16. "
        f"Fix: {REFUSAL_FIX}"
    )
    assert not read_records(out)


def test_a_worker_switched_to_fp8_mid_run_lands_nothing_it_made(
    two_workers: list[SimServerThread], prompt_tokenizer: Any, tmp_path: Path
) -> None:
    first, second = two_workers
    for worker in two_workers:
        worker.control(latency_s=0.05)
    with router(two_workers, tmp_path) as url:
        out = tmp_path / "run"
        config = make_config(
            [url],
            out,
            generation={"samples_per_prompt": 2, "temperature": 0.7},
            server={"guard_interval_s": 0.3, "guard_max_held": 1000},
        )
        run = Background(lambda: pipeline.generate(config, DATASET, None, progress=False))
        wait_for_records(out, 5)
        second.control(kv_cache_dtype="fp8_e4m3")
        error = run.join()
    assert isinstance(error, ServerRefusedError), error
    assert f"{second.url} (behind the router {url}) refused" in str(error)
    fp8_rids = {rid for rid, dtype in second.stats()["rid_kv_dtype"].items() if dtype != "bf16"}
    assert fp8_rids, "the fp8 worker did produce results"
    records = read_records(out)
    assert not fp8_rids & {r["rid"] for r in records}
    assert_faithful(out, config, first, prompt_tokenizer)  # bf16 outputs only


def test_a_dead_worker_behind_the_router_loses_nothing(
    tokenizer_dir: str, prompt_tokenizer: Any, tmp_path: Path
) -> None:
    # 0.25 s answers: the run is still going when the test stops a worker (80 answers, 8 at a
    # time: seconds of work are left after the first 10)
    steady = SimServerThread(sim_config(tokenizer_dir, latency_s=0.25)).start()
    doomed = SimServerThread(sim_config(tokenizer_dir, latency_s=0.25)).start()
    try:
        with router([steady, doomed], tmp_path) as url:
            out = tmp_path / "run"
            # The router keeps routing to a dead worker until its next health check (1 s here).
            # With the tests' usual 10-50 ms backoff an unlucky item could spend all its attempts
            # inside that second (seen once under load); the default backoff (1 s doubling, capped
            # at 60 s) spans it many times over. A short but real backoff keeps the test honest.
            config = make_config(
                [url],
                out,
                generation={"samples_per_prompt": 2, "temperature": 0.7},
                server={"down_deadline_s": 30, "backoff_base_s": 0.3, "backoff_max_s": 1.0},
            )
            run = Background(lambda: pipeline.generate(config, DATASET, None, progress=False))
            wait_for_records(out, 10)
            doomed.stop()
            error = run.join()
    finally:
        doomed.stop()
        steady.stop()
    assert error is None, error
    ids = [r["id"] for r in read_records(out)] + [f["id"] for f in read_failures(out)]
    assert len(ids) == len(set(ids)) == 80
    assert read_failures(out) == []
    assert_faithful(out, config, steady, prompt_tokenizer)
    assert verify_run(out).ok


def test_a_restart_of_the_only_worker_behind_the_router_fails_nothing(
    tokenizer_dir: str, prompt_tokenizer: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The router answers 500/503 to everything while its worker is gone, and 200 to /health:
    items must wait for the worker, not burn their attempts and land in the failure file."""
    # 0.25 s answers: the run is still going when the test stops the worker
    worker = SimServerThread(sim_config(tokenizer_dir, latency_s=0.25)).start()
    port = worker.port
    try:
        with router([worker], tmp_path) as url:
            out = tmp_path / "run"
            config = make_config(
                [url],
                out,
                generation={"samples_per_prompt": 2, "temperature": 0.7},
                server={"down_deadline_s": 30, "max_attempts": 3},
            )
            run = Background(lambda: pipeline.generate(config, DATASET, None, progress=False))
            wait_for_records(out, 10)
            worker.stop()
            # the router has seen it gone (and answers 500/503 to everything), whenever that is
            wait_for_healthy_workers(url, 0)
            worker = SimServerThread(sim_config(tokenizer_dir, latency_s=0.03), port=port).start()
            error = run.join()
    finally:
        worker.stop()
    assert error is None, error
    assert read_failures(out) == []
    ids = [r["id"] for r in read_records(out)]
    assert len(ids) == len(set(ids)) == 80
    assert_faithful(out, config, worker, prompt_tokenizer)
    assert "Traceback" not in capfd.readouterr().err
