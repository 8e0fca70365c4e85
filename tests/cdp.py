"""Headless Chromium driven over the DevTools protocol (tests only; aiohttp's websocket client).

``open_page`` loads a file with the network emulated offline and reports what a person would
notice: images that did not load (natural width 0), console errors and uncaught exceptions,
requests that left the file, the page's size, and a full-page screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
VIEWPORT = (1200, 900)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageCheck:
    images: list[dict[str, Any]] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    width: int = 0
    height: int = 0
    screenshot: bytes = b""

    @property
    def broken_images(self) -> list[dict[str, Any]]:
        return [image for image in self.images if not image["naturalWidth"]]


class Browser:
    def __init__(self, session: aiohttp.ClientSession, socket: Any) -> None:
        self._session = session
        self._socket = socket
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def pump(self) -> None:
        async for message in self._socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = message.json()
            waiter = self._pending.pop(data.get("id", -1), None)
            if waiter is not None:
                if "error" in data:
                    waiter.set_exception(RuntimeError(f"CDP error: {data['error']}"))
                else:
                    waiter.set_result(data.get("result", {}))
            elif "method" in data:
                await self.events.put(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[number] = waiter
        await self._socket.send_json({"id": number, "method": method, "params": params})
        return await waiter

    async def open_page(self, url: str) -> PageCheck:
        check = PageCheck()
        while not self.events.empty():
            self.events.get_nowait()
        await self.send(
            "Network.emulateNetworkConditions",
            offline=True,
            latency=0,
            downloadThroughput=-1,
            uploadThroughput=-1,
        )
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=VIEWPORT[0],
            height=VIEWPORT[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        await self.send("Page.navigate", url=url)
        while True:
            event = await self.events.get()
            self._note(event, check)
            if event["method"] == "Page.loadEventFired":
                break
        await asyncio.sleep(0.2)  # late console messages
        while not self.events.empty():
            self._note(self.events.get_nowait(), check)
        result = await self.send(
            "Runtime.evaluate",
            expression="Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete,"
            " naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight}))",
            returnByValue=True,
        )
        check.images = result["result"]["value"]
        metrics = await self.send("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        check.width, check.height = int(size["width"]), int(size["height"])
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        check.screenshot = base64.b64decode(shot["data"])
        return check

    @staticmethod
    def _note(event: dict[str, Any], check: PageCheck) -> None:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(arg.get("value", arg.get("description", ""))) for arg in params["args"]]
            check.console_errors.append(" ".join(texts))
        elif method == "Runtime.exceptionThrown":
            check.console_errors.append(str(params["exceptionDetails"].get("text")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            check.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            url = str(params["request"]["url"])
            if not url.startswith(("data:", "file:")):
                check.requests.append(url)


def _read_port(marker: Path) -> int | None:
    text = marker.read_text() if marker.is_file() else ""
    return int(text.splitlines()[0]) if text.strip() else None


async def _port(profile: Path, process: asyncio.subprocess.Process) -> int:
    marker = profile / "DevToolsActivePort"
    for _ in range(300):
        port = await asyncio.to_thread(_read_port, marker)
        if port is not None:
            return port
        if process.returncode is not None:
            raise RuntimeError(f"chromium exited with {process.returncode}")
        await asyncio.sleep(0.1)
    raise RuntimeError("chromium did not open its DevTools port in 30 s")


@contextlib.asynccontextmanager
async def chromium(executable: str) -> AsyncIterator[Browser]:
    # Chromium's helper processes (zygote, renderer, crash handler) can outlive the browser
    # process for a moment and still write to the profile: seen as "Directory not empty:
    # 'Default'" when the folder was removed under load. They share the browser's session, so
    # the whole group is killed before the folder goes (and a helper that is only a zombie by
    # then, in a container whose init does not reap, leaves no error behind either).
    with tempfile.TemporaryDirectory(
        prefix="eagledata-chromium-", ignore_cleanup_errors=True
    ) as profile:
        process = await asyncio.create_subprocess_exec(
            executable,
            *FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "TMPDIR": profile},  # its org.chromium.* scratch goes too
        )
        try:
            port = await _port(Path(profile), process)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                    targets = await response.json()
                page = next(t for t in targets if t["type"] == "page")
                async with session.ws_connect(
                    page["webSocketDebuggerUrl"], max_msg_size=0
                ) as socket:
                    browser = Browser(session, socket)
                    async with asyncio.TaskGroup() as group:
                        pump = group.create_task(browser.pump())
                        for domain in ("Page", "Runtime", "Log", "Network"):
                            await browser.send(f"{domain}.enable")
                        try:
                            yield browser
                        finally:
                            pump.cancel()
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    async with asyncio.timeout(10):
                        await process.wait()
                except TimeoutError:
                    process.kill()
                    await process.wait()
            await _kill_session(process.pid)


async def _kill_session(pid: int) -> None:
    """Kill what is left of the browser's process group, and give it a moment to go."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    for _ in range(20):
        await asyncio.sleep(0.1)
        try:
            os.killpg(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
