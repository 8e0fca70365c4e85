"""Every body a server sends is read under its cap as it is decompressed, on every route the
client reads, and every answer goes through one checked parse (``server/bodies.py``).

A bomb (``Content-Encoding: gzip, gzip``: 492 bytes on the wire, 200 MiB inside) once grew the
client until the kernel killed it, the request's deadline never firing because decompression
held the event loop; a plain gzip one inflated ~64 MB per network chunk before the cap was
looked at. Each test here measures the peak memory the call allocates (``tracemalloc``: the
hostile server in the same process allocates nothing of the bomb's inside).
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import SAMPLES, make_config, read_failures, read_records, run_cli
from eagledata.errors import ContractViolationError, ServerError
from eagledata.run import pipeline
from eagledata.server.bodies import CONTROL_BODY_BOUND, STEP_BYTES
from eagledata.server.client import SGLangClient
from eagledata.server.control import LOADS_ROUTE
from eagledata.server.generate_types import GenerateRequest
from eagledata.server.readiness import fetch_server_info, probe_health
from eagledata.server.responses import response_bound
from eagledata.server.router import healthy_workers
from hostile import BOMB_BYTES, HostileServer

DATASET = str(SAMPLES / "prompts.jsonl")
SLACK = 8 << 20
"""What a call may allocate besides its capped body: a few MB."""
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
PARAMS = {"max_new_tokens": 32, "temperature": 0.0}
GENERATE_BOUND = response_bound(
    GenerateRequest.model_validate({"input_ids": PROMPT, "sampling_params": PARAMS})
)

BOMBS = ["gzip, gzip", "gzip", "deflate"]


def peak_of(work: Callable[[], Any]) -> tuple[Any, int, float]:
    """``work()``'s outcome (or the exception it raised), the peak bytes it allocated above
    where it started, and the seconds it took."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        started = time.monotonic()
        try:
            outcome = work()
        except Exception as exc:  # the outcome is asserted by the caller
            outcome = exc
        took = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return outcome, peak, took


def with_client(url: str, call: Callable[[SGLangClient], Awaitable[Any]]) -> Callable[[], Any]:
    async def run() -> Any:
        async with SGLangClient([url], in_flight=16, request_timeout_s=30.0) as client:
            return await call(client)

    return lambda: asyncio.run(run())


@pytest.mark.parametrize("encoding", BOMBS)
def test_a_bomb_answering_generate_is_refused_within_a_few_mb_of_the_cap(
    tokenizer_dir: str, encoding: str
) -> None:
    misbehaviour = "bomb_" + encoding.replace(", ", "_")
    with HostileServer(tokenizer_dir, misbehaviour, only_sample=None) as server:
        outcome, peak, took = peak_of(
            with_client(server.url, lambda c: c.generate(PROMPT, PARAMS, "eagledata-" + "0" * 32))
        )
    assert peak < GENERATE_BOUND + SLACK, f"{peak:,} bytes for a cap of {GENERATE_BOUND:,}"
    assert peak < BOMB_BYTES // 10
    assert took < 10
    assert isinstance(outcome, ContractViolationError), outcome
    assert "answer refused unread: it passed" in str(outcome)
    assert "once decompressed" in str(outcome)


def test_sixteen_plain_gzip_bombs_in_flight_hold_sixteen_caps_not_sixteen_chunks(
    tokenizer_dir: str,
) -> None:
    """Each request inflated a whole network chunk (~64 MB of a plain gzip bomb) before its
    cap was looked at: 1.57 GB at 16 in flight."""

    async def sixteen(client: SGLangClient) -> list[BaseException | Any]:
        calls = [client.generate(PROMPT, PARAMS, f"eagledata-{i:032x}") for i in range(16)]
        return await asyncio.gather(*calls, return_exceptions=True)

    with HostileServer(tokenizer_dir, "bomb_gzip", only_sample=None) as server:
        outcomes, peak, _ = peak_of(with_client(server.url, sixteen))
    assert all(isinstance(outcome, ContractViolationError) for outcome in outcomes), outcomes
    assert peak < 16 * (GENERATE_BOUND + STEP_BYTES) + SLACK, f"{peak:,} bytes"


async def _loads(client: SGLangClient, url: str) -> Any:
    return await client.read_load(url)


CONTROL_CALLS: dict[str, Callable[[SGLangClient, str], Awaitable[Any]]] = {
    "/server_info": lambda client, url: client.server_info(url),
    "/health": lambda client, url: client.health(url),
    "/v1/loads": _loads,
    "/metrics": _loads,
    "/get_load": _loads,
    "/workers": lambda client, url: client.router_workers(url),
    "/abort_request": lambda client, url: client.abort(url, "eagledata-" + "0" * 32),
}
REFUSED = {"/server_info", "/v1/loads", "/metrics", "/get_load", "/workers"}
"""Routes whose bomb is a one-line refusal; a bomb on /health is a server not ready (False),
one on /abort_request a best-effort call that ends quietly."""


@pytest.mark.parametrize("encoding", BOMBS)
@pytest.mark.parametrize("route", sorted(CONTROL_CALLS))
def test_a_bomb_on_a_control_route_is_refused_within_a_few_mb_of_the_cap(
    tokenizer_dir: str, route: str, encoding: str
) -> None:
    """Today ``/server_info`` read 4.2 GB and said bf16 KV ok; ``/metrics`` and ``/v1/loads``
    ended in a ``MemoryError`` traceback."""
    with HostileServer(tokenizer_dir, spoiled={route: encoding}) as server:
        outcome, peak, took = peak_of(
            with_client(server.url, lambda client: CONTROL_CALLS[route](client, server.url))
        )
    if route in REFUSED:
        assert isinstance(outcome, ServerError), outcome
        asked = LOADS_ROUTE if route == "/v1/loads" else route
        assert str(outcome) == (
            f"{server.url}: GET {asked} "
            f"answer refused unread: it passed {CONTROL_BODY_BOUND:,} bytes once decompressed; "
            f"is {server.url} an SGLang server?"
        )
    elif route == "/health":
        assert outcome is False
    else:
        assert outcome is None
    assert peak < CONTROL_BODY_BOUND + SLACK, f"{peak:,} bytes"
    assert took < 10


@pytest.mark.parametrize("encoding", BOMBS)
def test_a_bomb_read_by_the_blocking_client_is_refused_within_a_few_mb_of_the_cap(
    tokenizer_dir: str, encoding: str
) -> None:
    """check-server, launch-server and plan read /health, /server_info and a router's /workers
    over a blocking client: bounded the same way."""
    routes = {"/health": encoding, "/server_info": encoding, "/workers": encoding}
    with HostileServer(tokenizer_dir, spoiled=routes) as server, httpx.Client() as http:
        info, info_peak, _ = peak_of(lambda: fetch_server_info(http, server.url))
        health, health_peak, _ = peak_of(lambda: probe_health(http, server.url))
        workers, workers_peak, _ = peak_of(lambda: healthy_workers(http, server.url))
    for peak in (info_peak, health_peak, workers_peak):
        assert peak < CONTROL_BODY_BOUND + SLACK, f"{peak:,} bytes"
    assert isinstance(info, ServerError), info
    assert "GET /server_info answer refused unread: it passed" in str(info)
    assert health == (
        False,
        f"answer refused unread: it passed {CONTROL_BODY_BOUND:,} bytes once decompressed",
    )
    assert workers is None


@pytest.mark.parametrize("misbehaviour", ["bomb_gzip_gzip", "brotli"])
def test_a_run_against_a_bomb_or_an_undecoded_encoding_fails_the_item_in_one_line(
    tokenizer_dir: str, tmp_path: Path, misbehaviour: str
) -> None:
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, misbehaviour) as server:
        config = make_config(
            [server.url],
            out,
            generation={"samples_per_prompt": 2, "max_new_tokens": 32},
            run={"limit": 2, "concurrency": 4},
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert (summary.written, summary.failed, summary.left) == (2, 2, 0)
    failures = read_failures(out)
    assert {f["reason"] for f in failures} == {"contract_violation"}
    if misbehaviour == "brotli":
        assert failures[0]["message"] == (
            f"{server.url}: POST /generate answer refused unread: it is sent with "
            "Content-Encoding 'br', which is not decoded"
        )
    else:
        assert (
            "once decompressed, more than an answer to this request can hold"
            in (failures[0]["message"])
        )


@pytest.mark.parametrize("misbehaviour", ["gzip_gzip_honest", "deflate_honest"])
def test_an_honest_answer_a_proxy_compressed_is_still_read(
    tokenizer_dir: str, tmp_path: Path, misbehaviour: str
) -> None:
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, misbehaviour, only_sample=None) as server:
        config = make_config(
            [server.url],
            out,
            generation={"samples_per_prompt": 1, "max_new_tokens": 32},
            run={"limit": 3, "concurrency": 4},
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert (summary.written, summary.failed) == (3, 0)
    assert all(record["output_ids"] for record in read_records(out))


def test_check_server_refuses_a_server_info_bomb_in_one_line(tokenizer_dir: str) -> None:
    """It read 4.2 GB and printed "bf16 KV ok"."""
    with HostileServer(tokenizer_dir, spoiled={"/server_info": "gzip, gzip"}) as server:
        done = run_cli("check-server", server.url)
    assert done.returncode == 3, done.stderr
    assert done.stderr == (
        f"eagledata: error: {server.url}: GET /server_info answer refused unread: it passed "
        f"{CONTROL_BODY_BOUND:,} bytes once decompressed; is {server.url} an SGLang server?\n"
    )


# --- one checked parse: an answer that is not what the route promises is one line ---------

NGINX = "`<!DOCTYPE html> <html><head><title>Welcome to nginx!</title>...`"


def run_config(url: str, out: Path, limit: int = 4) -> Any:
    return make_config(
        [url],
        out,
        generation={"samples_per_prompt": 1, "max_new_tokens": 32},
        run={"limit": limit, "concurrency": 2},
        server={"guard_interval_s": 0.1},
    )


@pytest.mark.parametrize("spoil", ["html", "list"])
def test_a_server_info_that_is_not_a_json_object_is_one_line_at_start(
    tokenizer_dir: str, tmp_path: Path, spoil: str
) -> None:
    """An HTML page on /server_info was an orjson.JSONDecodeError traceback."""
    with (
        HostileServer(tokenizer_dir, spoiled={"/server_info": spoil}) as server,
        pytest.raises(ServerError) as refused,
    ):
        pipeline.generate(run_config(server.url, tmp_path / "run"), DATASET, None, progress=False)
    expected = (
        f"200 with text/html ({NGINX}), not JSON" if spoil == "html" else "list, not an object"
    )
    assert str(refused.value) == (
        f"{server.url}: GET /server_info answered {expected}: is {server.url} an SGLang server?"
    )


def test_an_html_server_info_mid_run_is_one_line(tokenizer_dir: str, tmp_path: Path) -> None:
    """The guard's re-check read an HTML page once the run was under way: a traceback."""
    out = tmp_path / "run"
    spoiled = {"/server_info": "html"}
    with (
        HostileServer(tokenizer_dir, spoiled=spoiled, spoiled_after=2) as server,
        pytest.raises(ServerError) as refused,
    ):
        pipeline.generate(run_config(server.url, out, limit=12), DATASET, None, progress=False)
    assert str(refused.value) == (
        f"{server.url}: GET /server_info answered 200 with text/html ({NGINX}), not JSON: is "
        f"{server.url} an SGLang server?"
    )


@pytest.mark.parametrize("route", ["/v1/loads", "/get_load"])
def test_a_load_route_answering_html_is_one_line(tokenizer_dir: str, route: str) -> None:
    """What the load controller samples mid-run under --concurrency auto."""
    with HostileServer(tokenizer_dir, spoiled={route: "html"}) as server:
        outcome, _, _ = peak_of(with_client(server.url, lambda c: c.read_load(server.url)))
    asked = LOADS_ROUTE if route == "/v1/loads" else route
    assert isinstance(outcome, ServerError), outcome
    assert str(outcome) == (
        f"{server.url}: GET {asked} answered 200 with text/html ({NGINX}), not JSON: is "
        f"{server.url} an SGLang server?"
    )


def test_check_server_against_an_html_page_is_one_line(tokenizer_dir: str) -> None:
    with HostileServer(tokenizer_dir, spoiled={"/server_info": "html"}) as server:
        done = run_cli("check-server", server.url)
    assert done.returncode == 3, done.stderr
    assert done.stderr == (
        f"eagledata: error: {server.url}: GET /server_info answered 200 with text/html "
        f"({NGINX}), not JSON: is {server.url} an SGLang server?\n"
    )


def test_generate_answering_html_is_an_item_failure_saying_what_came(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with HostileServer(tokenizer_dir, "html") as server:
        config = make_config(
            [server.url],
            out,
            generation={"samples_per_prompt": 2, "max_new_tokens": 32},
            run={"limit": 2, "concurrency": 4},
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert (summary.written, summary.failed) == (2, 2)
    assert {f["message"] for f in read_failures(out)} == {
        f"{server.url}: POST /generate answered 200 with text/html ({NGINX}), not JSON"
    }


# --- a whole-call deadline on the blocking client -------------------------------------------


@pytest.mark.slow
def test_check_server_against_a_server_info_dripped_a_byte_a_second_ends_within_its_timeout(
    tokenizer_dir: str,
) -> None:
    """Its timeout bounded each read, not the call: a byte a second kept it for hours."""
    with HostileServer(tokenizer_dir, spoiled={"/server_info": "drip"}, trickle_s=1.0) as server:
        started = time.monotonic()
        done = run_cli("check-server", server.url, "--timeout", "3")
        took = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert done.stderr == (
        f"eagledata: error: cannot read {server.url}/server_info (ReadTimeout: no whole answer "
        "within 3s); check the server's log\n"
    )
    assert took < 3 + 15  # the CLI's own start (imports) on a loaded machine, and one read


@pytest.mark.slow
def test_the_blocking_clients_deadline_covers_the_whole_call(tokenizer_dir: str) -> None:
    with (
        HostileServer(tokenizer_dir, spoiled={"/server_info": "drip"}, trickle_s=0.5) as server,
        httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0)) as http,
    ):
        outcome, _, took = peak_of(lambda: fetch_server_info(http, server.url, deadline_s=2.0))
    assert isinstance(outcome, ServerError), outcome
    assert "no whole answer within 2s" in str(outcome)
    assert took < 2 + 1
