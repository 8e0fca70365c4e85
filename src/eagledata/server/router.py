"""``launch-server --router URL...``: the real sglang-router in front of running servers, every
one of them checked.

A team with several nodes runs one SGLang server per node (or per pair, for a two-node profile)
and one job over all of them: SGLang's own answer is ``sglang-router`` (``pip install
sglang-router``; it runs on CPU), which spreads ``/generate`` over its workers. eagledata starts
it (``python -m sglang_router.launch_router``), waits until it counts every worker healthy, then
reads each worker's ``/server_info`` directly, as the run's KV guard does (``server/guard.py``):
the router's own ``/get_server_info`` describes the router, not a worker's KV cache. One worker
that is not bf16 and the router is stopped, that worker named. ``eagledata generate --server
ROUTER_URL`` then runs one job over every worker, and checks every worker behind it again,
periodically, with the KV guard and the logprob canary.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from eagledata.errors import LaunchError, ServerRefusedError
from eagledata.server.answers import router_worker_urls
from eagledata.server.bodies import BodyTooLarge, BodyUnreadable, get_bounded_sync
from eagledata.server.control import CONTROL_DEADLINE_S
from eagledata.server.launch import start_process, stop_process
from eagledata.server.readiness import ProgressCallback, check_running_server
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import GuardVerdict

ROUTER_MODULE = "sglang_router.launch_router"
DEFAULT_ROUTER_PORT = 30100
STDERR_FD = 2


def router_python(env: Mapping[str, str] | None = None) -> str:
    """The interpreter that runs sglang-router: ``$SGLANG_ROUTER_PYTHON``, else eagledata's own
    (``pip install sglang-router`` beside eagledata: it needs no GPU)."""
    return (os.environ if env is None else env).get("SGLANG_ROUTER_PYTHON") or sys.executable


def normalize_worker(url: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port`` (what the router lists)."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def build_router_command(
    workers: Sequence[str],
    *,
    host: str,
    port: int,
    python: str,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``python -m sglang_router.launch_router`` over ``workers``; its Prometheus exporter on
    ``port + 1`` (its default, 29000, would clash with a second router on the machine), its log
    at warnings; extra arguments last, so they override."""
    if not workers:
        raise LaunchError("--router: name at least one running server (--router URL, repeat)")
    return [
        python, "-m", ROUTER_MODULE,
        "--worker-urls", *workers,
        "--host", host, "--port", str(port),
        "--prometheus-host", host, "--prometheus-port", str(port + 1),
        "--log-level", "warn",  # its info log is a line per request
        *extra_args,
    ]  # fmt: skip


def port_in_use(host: str, port: int) -> bool:
    """Would binding ``host:port`` fail because something holds it?"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # as a server binds: a port in TIME_WAIT is free to it, one that is held is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def check_ports_free(host: str, port: int, extra_args: Sequence[str]) -> None:
    """The router's port and its Prometheus exporter's (``port + 1`` unless the extra arguments
    name one), checked before it starts: taken, the router panics at start-up with a stack
    trace; here it is one line naming the fix."""
    wanted = [(port, "--router-port")]
    if "--prometheus-port" not in extra_args:
        wanted.append((port + 1, "its Prometheus exporter's, --router-port + 1"))
    for number, what in wanted:
        if port_in_use(host, number):
            raise LaunchError(
                f"port {number} ({what}) is already in use on {host}: pick another "
                "--router-port, or name the exporter's with '-- --prometheus-port P'"
            )


def router_url(host: str, port: int) -> str:
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in reach and not reach.startswith("["):
        reach = f"[{reach}]"
    return f"http://{reach}:{port}"


def healthy_workers(client: httpx.Client, url: str) -> list[str] | None:
    """The workers the router at ``url`` marks healthy (``GET /workers``); None while it does
    not answer."""
    try:
        reply = get_bounded_sync(client, url, "/workers", deadline_s=CONTROL_DEADLINE_S)
    except (httpx.HTTPError, BodyTooLarge, BodyUnreadable):
        return None
    if reply.status != 200:
        return None
    return router_worker_urls(reply.body, "workers")


def wait_for_router(
    client: httpx.Client,
    url: str,
    workers: Sequence[str],
    *,
    deadline_s: float,
    process: subprocess.Popen[bytes] | None = None,
    poll_interval_s: float = 0.5,
    on_progress: ProgressCallback | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Poll the router until it counts every one of ``workers`` healthy; the workers it lists.
    ``LaunchError`` when the router exits first or ``deadline_s`` passes (naming the workers it
    has not counted healthy)."""
    start = clock()
    wanted = {normalize_worker(w) for w in workers}
    last: list[str] | None = None
    said = -1
    while True:
        if process is not None and process.poll() is not None:
            raise LaunchError(
                f"sglang-router exited with code {process.returncode} before it served {url}. "
                "Fix: read its "
                f"output above (is sglang-router installed for {router_python()}? pip install "
                "sglang-router==0.3.2)"
            )
        last = healthy_workers(client, url)
        seen = {normalize_worker(w) for w in last or []}
        if last is not None and wanted <= seen:
            if on_progress is not None:
                on_progress(
                    f"router {url}: {len(seen)} healthy workers after {clock() - start:.0f}s"
                )
            return last
        elapsed = clock() - start
        if elapsed >= deadline_s:
            missing = ", ".join(sorted(wanted - seen)) or "?"
            state = "never answered" if last is None else f"does not count {missing} healthy"
            raise LaunchError(
                f"router {url} {state} after {deadline_s:.0f}s. Fix: start those servers "
                "(eagledata launch-server on each node) or fix their URLs"
            )
        if on_progress is not None and int(elapsed // 10) > said:
            said = int(elapsed // 10)  # one line each 10 s
            on_progress(f"waiting for router {url}: {len(seen)}/{len(wanted)} workers healthy")
        sleep(max(0.0, min(poll_interval_s, deadline_s - elapsed)))


@dataclass
class WorkerCheck:
    url: str
    facts: ServerFacts
    verdict: GuardVerdict


def check_workers(
    client: httpx.Client,
    url: str,
    workers: Sequence[str],
    *,
    bf16_bytes_per_token: int | None = None,
    expected_model: str | None = None,
    api_key_env: str = "SGLANG_API_KEY",
) -> list[WorkerCheck]:
    """Every worker's own ``/server_info`` and bf16 verdict; ``ServerRefusedError`` naming each
    worker that is refused (all of them, not only the first). The first worker's model is
    pinned: a router over two models is refused like an fp8 worker is."""
    checked: list[WorkerCheck] = []
    model = expected_model
    for worker in workers:
        facts, verdict = check_running_server(
            client,
            worker,
            expected_model=model,
            bf16_bytes_per_token=bf16_bytes_per_token,
            api_key_env=api_key_env,
        )
        model = model or facts.model_path
        checked.append(WorkerCheck(worker, facts, verdict))
    refused = [c for c in checked if not c.verdict.ok]
    if refused:
        raise ServerRefusedError(
            "; ".join(
                f"{c.url} (behind the router {url}) refused: {'; '.join(c.verdict.problems)}"
                for c in refused
            )
            + ". Fix: relaunch it with --kv-cache-dtype bf16 (eagledata launch-server), or "
            "leave it out of --router"
        )
    return checked


@dataclass
class RouterResult:
    command: list[str]
    process: subprocess.Popen[bytes]
    url: str
    workers: list[WorkerCheck] = field(default_factory=list)

    def stop(self, *, timeout_s: float = 30.0) -> int | None:
        return stop_process(self.process, timeout_s=timeout_s)


def launch_router(
    workers: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_ROUTER_PORT,
    extra_args: Sequence[str] = (),
    python: str | None = None,
    deadline_s: float = 1800.0,
    client: httpx.Client | None = None,
    on_progress: ProgressCallback | None = None,
    bf16_bytes_per_token: int | None = None,
    expected_model: str | None = None,
    api_key_env: str = "SGLANG_API_KEY",
) -> RouterResult:
    """Start sglang-router over ``workers``, wait until it counts them all healthy, and check
    every worker it lists. Anything that goes wrong (a refused worker, the deadline, Ctrl-C)
    stops the router before the error propagates: nothing is left running."""
    wanted = [normalize_worker(w) for w in workers]
    check_ports_free(host, port, extra_args)
    command = build_router_command(
        wanted, host=host, port=port, python=python or router_python(), extra_args=extra_args
    )
    url = router_url(host, port)
    if on_progress is not None:
        on_progress(f"starting: {' '.join(command)}")
    process = start_process(command, stdout=STDERR_FD)  # stdout is launch-server's verdicts
    own_client = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0))
    try:
        listed = wait_for_router(
            http, url, wanted, deadline_s=deadline_s, process=process, on_progress=on_progress
        )
        checked = check_workers(
            http,
            url,
            listed,
            bf16_bytes_per_token=bf16_bytes_per_token,
            expected_model=expected_model,
            api_key_env=api_key_env,
        )
    except BaseException:
        stop_process(process)
        raise
    finally:
        if own_client:
            http.close()
    return RouterResult(command, process, url, checked)
