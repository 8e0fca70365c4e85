"""Run the simulated server: in a daemon thread (tests, benchmarks) or blocking (the CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from aiohttp import web

from eagledata.simserver.app import create_app
from eagledata.simserver.config import SimConfig
from eagledata.simserver.state import STATE, apply_control, stats_snapshot

SHUTDOWN_TIMEOUT_S = 0.25
"""On stop, in-flight requests get this long before their connections are cut."""


async def _start(config: SimConfig, host: str, port: int) -> tuple[web.AppRunner, int]:
    app = create_app(config)
    runner = web.AppRunner(
        app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    await site.start()
    bound = int(runner.addresses[0][1])
    state = app[STATE]
    state.host, state.port = host, bound
    return runner, bound


class SimServerThread:
    """The simulated server on its own event loop in a daemon thread.

    ``with SimServerThread(SimConfig(latency_s=0.1)) as sim: httpx.get(sim.url + "/health")``
    """

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.config = config if config is not None else SimConfig()
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimServerThread:
        started: Future[int] = Future()
        self._thread = threading.Thread(
            target=self._serve, args=(started,), name="sim-server", daemon=True
        )
        self._thread.start()
        self.port = started.result(timeout=30)
        return self

    def _serve(self, started: Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._runner, port = loop.run_until_complete(_start(self.config, self.host, self.port))
        except BaseException as exc:
            started.set_exception(exc)
            loop.close()
            return
        started.set_result(port)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)

    def _call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(state, *args)`` on the server's loop and return its result."""
        if self._loop is None or self._runner is None:
            raise RuntimeError("the simulated server is not running")
        state = self._runner.app[STATE]

        async def call() -> Any:
            return fn(state, *args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    def control(self, **changes: Any) -> dict[str, Any]:
        """Change SimConfig fields at runtime, like ``POST /_sim/control``; returns the config."""
        result: dict[str, Any] = self._call(apply_control, changes)
        return result

    def stats(self) -> dict[str, Any]:
        """The ``GET /_sim/stats`` snapshot."""
        result: dict[str, Any] = self._call(stats_snapshot)
        return result

    def __enter__(self) -> SimServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_sim_server(config: SimConfig, host: str = "127.0.0.1", port: int = 30000) -> None:
    """Serve until SIGINT/SIGTERM. Prints ``sim-server listening on http://HOST:PORT`` once
    bound, so a parent process can learn an ephemeral port (``port=0``)."""

    async def main() -> None:
        runner, bound = await _start(config, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not main thread
                loop.add_signal_handler(sig, stop.set)
        print(f"sim-server listening on http://{host}:{bound}", flush=True)
        sys.stdout.flush()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
