"""Client overhead: eagledata's ``SGLangClient`` against a plain httpx pool, on a simulated server.

The simulated SGLang server runs in its own process (``run_sim_server`` on an ephemeral port),
pinned to one core; this process is the client, pinned to another, so each side's CPU time is its
own and neither steals the other's core. Every measurement point gets fresh servers. Requests are
realistic: ~300-token ``input_ids``, and every answer runs to ``max_new_tokens`` output ids (plus
the decoded ``text``). They are driven through eagledata's own ``Scheduler``: a closed loop with a
fixed number of requests in flight, the first wave spread over one latency so that answers arrive
evenly, as from a real server, rather than in synchronized bursts.

A point runs a warm-up (all connections opened, steady state reached), then counts only the
requests that complete inside a fixed window. Client CPU is ``time.process_time()`` over the
window; server CPU is the server processes' utime + stime from ``/proc``.

Clients: ``sglang`` (``SGLangClient``), ``httpx`` (one ``httpx.AsyncClient`` whose pool holds every
request in flight: the baseline), ``aiohttp`` (one ``aiohttp.ClientSession``: a C-parser design, for
comparison). All three do the same encoding and the same response checks.

    python benchmarks/bench_client.py                  # the default points, about 5 minutes
    python benchmarks/bench_client.py --duration 5 --points sglang:1024:2 httpx:1024:2

Prints a markdown table and writes ``benchmarks/results/client.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from eagledata.errors import EagledataError
from eagledata.run.scheduler import Scheduler
from eagledata.server.client import SGLangClient, new_rid
from eagledata.server.generate_types import GenerateAnswer, GenerateRequest, SamplingParams
from eagledata.server.responses import check_answer
from eagledata.simserver import SimConfig

RESULTS = Path(__file__).resolve().parent / "results" / "client.json"
CLIENTS = ("sglang", "httpx", "aiohttp")
DEFAULT_POINTS = (
    "sglang:64:0",
    "httpx:64:0",
    "aiohttp:64:0",
    "sglang:256:2",
    "httpx:256:2",
    "sglang:1024:2",
    "httpx:1024:2",
    "aiohttp:1024:2",
)
TARGET_FRACTION = 0.95
"""The bar: at least 95% of the ideal rate at 1,024 in flight."""
CLIENT_NAMES = {
    "sglang": "SGLangClient",
    "httpx": "one httpx.AsyncClient",
    "aiohttp": "one aiohttp.ClientSession",
}

SERVER_CODE = """\
import sys
from eagledata.simserver import SimConfig, run_sim_server
run_sim_server(SimConfig.model_validate_json(sys.argv[1]), "127.0.0.1", 0)
"""
LISTENING = "sim-server listening on "
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Send = Callable[[list[int], str], Awaitable[int]]
"""Send one request; return its completion token count."""


# --- the servers, in their own processes ---------------------------------------------------------


def sim_config(latency_s: float) -> SimConfig:
    """A server whose KV model never limits: only ``latency_s`` sets the time per request, and
    every request runs to its ``max_new_tokens``."""
    return SimConfig(
        latency_s=latency_s,
        max_total_num_tokens=50_000_000,
        max_running_requests=1_000_000,
        length_fraction=1.0,
    )


@contextlib.contextmanager
def sim_servers(
    config: SimConfig, count: int, cpus: set[int] | None
) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` ``run_sim_server`` child processes; yields them once each listens."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVER_CODE, config.model_dump_json()],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            if cpus is not None:
                os.sched_setaffinity(proc.pid, cpus)
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def server_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(LISTENING):
        raise RuntimeError(f"sim-server did not start (it said {line!r})")
    return line[len(LISTENING) :].strip()


def cpu_seconds(procs: list[subprocess.Popen[str]]) -> float | None:
    """utime + stime of the processes, from ``/proc`` (None where there is no ``/proc``)."""
    total = 0.0
    for proc in procs:
        try:
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


# --- one measurement point -----------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    client: str
    in_flight: int
    latency_s: float

    @classmethod
    def parse(cls, spec: str) -> Point:
        try:
            client, in_flight, latency = spec.split(":")
            point = cls(client, int(in_flight), float(latency))
        except ValueError:
            raise SystemExit(f"bad point {spec!r}: write CLIENT:IN_FLIGHT:LATENCY_S") from None
        if point.client not in CLIENTS or point.in_flight < 1 or point.latency_s < 0:
            raise SystemExit(f"bad point {spec!r}: CLIENT is one of {', '.join(CLIENTS)}")
        return point


@dataclass
class Result:
    client: str
    in_flight: int
    latency_s: float
    servers: int
    connections_per_pool: int | None
    warmup_s: float
    window_s: float
    requests: int
    """Requests completed inside the window."""
    errors: dict[str, int]
    req_per_s: float
    ideal_req_per_s: float | None
    """in_flight / latency_s."""
    fraction_of_ideal: float | None
    output_tok_per_s: float
    client_cpu_percent: float
    req_per_client_cpu_s: float | None
    """Requests per second of client CPU: what one fully busy client core could handle."""
    server_cpu_percent: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    gc_pause_s: float
    """Time the client spent in Python's cyclic garbage collector during the window."""
    gc_max_pause_s: float


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


@dataclass
class Window:
    """What one point measures; the rest of ``Result`` is derived from it."""

    warmup_s: float
    duration_s: float
    servers: list[subprocess.Popen[str]]
    burst: bool = False
    """Start every request at once (synchronized waves) instead of spreading the first wave."""
    wall: float = 0.0
    cpu: float = 0.0
    server_cpu: float | None = None
    tokens: int = 0
    gc_pauses: list[float] = field(default_factory=list)
    open: bool = False
    """True between the two clock readings: only what happens then is counted."""


@contextlib.contextmanager
def gc_pauses(window: Window) -> Iterator[None]:
    """Record the length of every garbage collection that ends while the window is open."""
    started = 0.0

    def callback(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        elif window.open:
            window.gc_pauses.append(time.perf_counter() - started)

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)


async def drive(
    send: Send, in_flight: int, latency_s: float, prompts: list[list[int]], window: Window
) -> tuple[list[float], dict[str, int]]:
    """Keep ``in_flight`` requests going through ``Scheduler``; measure one window.

    Returns the latencies of the requests that completed inside the window, and the errors.
    """
    loop = asyncio.get_running_loop()
    scheduler: Scheduler[list[int]] = Scheduler(in_flight)
    start = loop.time()
    opens = start + window.warmup_s
    latencies: list[float] = []
    errors: dict[str, int] = {}

    async def source() -> AsyncIterator[list[int]]:
        for index in itertools.count():
            if scheduler.stopping:
                return
            if index < in_flight and latency_s > 0 and not window.burst:
                # Spread the first wave over one latency, so answers arrive evenly.
                await asyncio.sleep(start + index * latency_s / in_flight - loop.time())
            yield prompts[index % len(prompts)]

    async def handle(input_ids: list[int]) -> None:
        sent = loop.time()
        try:
            completion = await send(input_ids, new_rid())
        except (EagledataError, httpx.HTTPError, aiohttp.ClientError) as exc:
            name = type(exc).__name__
            errors[name] = errors.get(name, 0) + 1
            return
        if window.open:
            latencies.append(loop.time() - sent)
            window.tokens += completion

    async def clock() -> None:
        await asyncio.sleep(opens - loop.time())
        # A saturated loop runs these timers late: the window is what lies between the readings.
        wall0, cpu0, server0 = loop.time(), time.process_time(), cpu_seconds(window.servers)
        window.open = True
        await asyncio.sleep(window.duration_s)
        window.open = False
        window.wall = loop.time() - wall0
        window.cpu = time.process_time() - cpu0
        server1 = cpu_seconds(window.servers)
        if server0 is not None and server1 is not None:
            window.server_cpu = server1 - server0
        scheduler.stop()

    gc.collect()
    run = asyncio.create_task(scheduler.run(source(), handle))
    with gc_pauses(window):
        await clock()
    # Let in-flight requests finish; a client too slow to drain in time is cut off.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(latency_s + 10.0):
            await asyncio.shield(run)
    if not run.done():
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    return latencies, errors


async def measure(
    point: Point,
    urls: list[str],
    prompts: list[list[int]],
    sampling: dict[str, Any],
    pool_size: int | None,
    window: Window,
) -> tuple[list[float], dict[str, int]]:
    """Run one point with the client it names."""
    n, latency = point.in_flight, point.latency_s
    next_url = itertools.cycle(urls).__next__

    def body(input_ids: list[int], rid: str) -> bytes:
        params = SamplingParams.model_validate(sampling)
        return GenerateRequest(input_ids=input_ids, sampling_params=params, rid=rid).body()

    def checked(content: bytes, input_ids: list[int], rid: str, url: str) -> int:
        answer = GenerateAnswer.model_validate_json(content)
        return check_answer(answer, input_ids, rid, url).completion_tokens

    if point.client == "sglang":
        sglang = (
            SGLangClient(urls, in_flight=n)
            if pool_size is None
            else SGLangClient(urls, in_flight=n, connections_per_pool=pool_size)
        )
        async with sglang as client:

            async def send_sglang(input_ids: list[int], rid: str) -> int:
                result = await client.generate(input_ids, sampling, rid)
                return result.completion_tokens

            return await drive(send_sglang, n, latency, prompts, window)

    headers = {"Content-Type": "application/json"}
    if point.client == "httpx":
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        timeout = httpx.Timeout(10.0, read=3600.0, pool=None)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as plain:

            async def send_httpx(input_ids: list[int], rid: str) -> int:
                url = next_url()
                response = await plain.post(url + "/generate", content=body(input_ids, rid))
                response.raise_for_status()
                return checked(response.content, input_ids, rid, url)

            return await drive(send_httpx, n, latency, prompts, window)

    connector = aiohttp.TCPConnector(limit=n, limit_per_host=0)
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=3600.0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=client_timeout, headers=headers
    ) as session:

        async def send_aiohttp(input_ids: list[int], rid: str) -> int:
            url = next_url()
            async with session.post(url + "/generate", data=body(input_ids, rid)) as response:
                response.raise_for_status()
                content = await response.read()
            return checked(content, input_ids, rid, url)

        return await drive(send_aiohttp, n, latency, prompts, window)


def run_point(point: Point, args: argparse.Namespace, server_cpus: set[int] | None) -> Result:
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 150_000) for _ in range(args.prompt_tokens)] for _ in range(256)]
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0}
    warmup = args.warmup if args.warmup is not None else 2 * point.latency_s + 3.0
    with sim_servers(sim_config(point.latency_s), args.servers, server_cpus) as procs:
        urls = [server_url(proc) for proc in procs]
        window = Window(warmup_s=warmup, duration_s=args.duration, servers=procs, burst=args.burst)
        pool_size = args.connections_per_pool
        latencies, errors = asyncio.run(measure(point, urls, prompts, sampling, pool_size, window))
    count = len(latencies)
    ideal = point.in_flight / point.latency_s if point.latency_s > 0 else None
    rate = count / window.wall
    return Result(
        client=point.client,
        in_flight=point.in_flight,
        latency_s=point.latency_s,
        servers=args.servers,
        connections_per_pool=pool_size if point.client == "sglang" else None,
        warmup_s=warmup,
        window_s=round(window.wall, 3),
        requests=count,
        errors=errors,
        req_per_s=round(rate, 1),
        ideal_req_per_s=ideal,
        fraction_of_ideal=round(rate / ideal, 4) if ideal else None,
        output_tok_per_s=round(window.tokens / window.wall),
        client_cpu_percent=round(100 * window.cpu / window.wall, 1),
        req_per_client_cpu_s=round(count / window.cpu) if window.cpu > 0 else None,
        server_cpu_percent=(
            None if window.server_cpu is None else round(100 * window.server_cpu / window.wall, 1)
        ),
        latency_p50_s=quantile(latencies, 0.5),
        latency_p99_s=quantile(latencies, 0.99),
        gc_pause_s=round(sum(window.gc_pauses), 3),
        gc_max_pause_s=round(max(window.gc_pauses, default=0.0), 3),
    )


# --- reporting -----------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def row(r: Result) -> str:
    pct = None if r.fraction_of_ideal is None else 100 * r.fraction_of_ideal
    return (
        f"| {CLIENT_NAMES[r.client]} | {r.in_flight} | {r.latency_s:g} s | {r.req_per_s:.1f} "
        f"| {fmt(r.ideal_req_per_s)} | {fmt(pct, '.1f', '%')} | {r.output_tok_per_s:,.0f} "
        f"| {r.client_cpu_percent:.0f}% | {fmt(r.req_per_client_cpu_s)} "
        f"| {fmt(r.server_cpu_percent, '.0f', '%')} "
        f"| {fmt(r.latency_p50_s, '.3f')} / {fmt(r.latency_p99_s, '.3f')} s "
        f"| {sum(r.errors.values())} |"
    )


def table(results: list[Result]) -> str:
    header = (
        "| client | in flight | latency | req/s | ideal | % of ideal | out tok/s | client CPU "
        "| req/s per client core | server CPU | p50 / p99 latency | errors |"
    )
    return "\n".join([header, "|" + "---|" * 12, *(row(r) for r in results)])


def pin(enabled: bool) -> tuple[set[int], set[int]] | None:
    """Servers on the first available core, this client process on the second."""
    if not enabled or not hasattr(os, "sched_setaffinity"):
        return None
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None
    server, client = {available[0]}, {available[1]}
    os.sched_setaffinity(0, client)
    return server, client


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="SGLangClient overhead against the sim-server.")
    parser.add_argument(
        "--points",
        nargs="+",
        default=list(DEFAULT_POINTS),
        metavar="CLIENT:IN_FLIGHT:LATENCY_S",
        help=f"what to measure; CLIENT is one of {', '.join(CLIENTS)}",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="measured window, seconds")
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds before the window (2 x latency + 3)"
    )
    parser.add_argument("--servers", type=int, default=1, help="sim-server processes")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="start all requests at once: answers then come in synchronized waves (worst case)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--connections-per-pool",
        type=int,
        default=None,
        help="SGLangClient's connections_per_pool (default: its own default)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin servers and client")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    points = [Point.parse(spec) for spec in args.points]
    cpus = pin(not args.no_pin)

    results = []
    for point in points:
        print(
            f"measuring {point.client}:{point.in_flight}:{point.latency_s:g} ...",
            file=sys.stderr,
            flush=True,
        )
        results.append(run_point(point, args, cpus and cpus[0]))
        print(row(results[-1]), file=sys.stderr, flush=True)

    print(table(results))
    for r in results:
        if r.client == "sglang" and r.in_flight >= 1024 and r.fraction_of_ideal is not None:
            verdict = "meets" if r.fraction_of_ideal >= TARGET_FRACTION else "MISSES"
            print(
                f"\nSGLangClient at {r.in_flight} in flight: {100 * r.fraction_of_ideal:.1f}% of "
                f"ideal; {verdict} the {100 * TARGET_FRACTION:.0f}% target"
            )
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "aiohttp": aiohttp.__version__,
        "cpus": os.cpu_count(),
        "pinned": None if cpus is None else {"server": sorted(cpus[0]), "client": sorted(cpus[1])},
        "duration_s": args.duration,
        "burst": args.burst,
        "servers": args.servers,
        "prompt_tokens": args.prompt_tokens,
        "max_new_tokens": args.max_new_tokens,
        "results": [asdict(r) for r in results],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
