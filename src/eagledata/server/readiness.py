"""Is a server up, and what is it? The ``/health`` poll of a server starting, and its
``/server_info`` fetched and judged by the bf16 guard (``check-server``, ``launch-server``,
``plan --server``), over a blocking ``httpx.Client``: every call bounded as a whole
(``CONTROL_DEADLINE_S``, not each read) and every body under its cap as it is decompressed
(``bodies.get_bounded_sync``)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx

from eagledata.errors import (
    ConfigError,
    LaunchError,
    ServerError,
    ServerRefusedError,
    ServerUnavailableError,
)
from eagledata.server.answers import auth_error
from eagledata.server.bodies import BodyTooLarge, BodyUnreadable, get_bounded_sync
from eagledata.server.control import CONTROL_DEADLINE_S
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import GuardVerdict, evaluate_kv_guard

ProgressCallback = Callable[[str], None]


def probe_health(
    client: httpx.Client, base_url: str, deadline_s: float = CONTROL_DEADLINE_S
) -> tuple[bool, str]:
    """One ``GET /health``: ``(ready, what was seen)``. Never raises for network trouble."""
    try:
        reply = get_bounded_sync(client, base_url, "/health", deadline_s=deadline_s)
    except httpx.ConnectError:
        return False, "not listening yet"
    except httpx.TimeoutException:
        return False, "timed out"
    except httpx.HTTPError as error:
        return False, type(error).__name__
    except (BodyTooLarge, BodyUnreadable) as error:
        return False, f"answer refused unread: {error}"
    if reply.status == 200:
        return True, "HTTP 200"
    return False, f"HTTP {reply.status}"


def fetch_server_info(
    client: httpx.Client,
    base_url: str,
    api_key_env: str = "SGLANG_API_KEY",
    deadline_s: float = CONTROL_DEADLINE_S,
) -> dict[str, object]:
    """The JSON object of ``/server_info`` (falls back to ``/get_server_info`` on a 404). A
    refused key (401/403) is said as such, naming ``api_key_env``; an answer that is not a JSON
    object, or larger than any ``/server_info``, in one line naming the route. Each route's
    whole call ends within ``deadline_s``."""
    last = ""
    for route in ("/server_info", "/get_server_info"):
        try:
            reply = get_bounded_sync(client, base_url, route, deadline_s=deadline_s)
        except (BodyTooLarge, BodyUnreadable) as error:
            raise ServerError(
                f"{base_url}: GET {route} answer refused unread: {error}; is {base_url} an "
                "SGLang server?"
            ) from None
        except httpx.HTTPError as error:
            if isinstance(error, httpx.UnsupportedProtocol):
                raise ConfigError(
                    f"{base_url} has no http:// or https://; add it: http://{base_url}"
                ) from None
            fix = (
                "is an SGLang server running there? start one (eagledata launch-server) or fix "
                "the URL"
                if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)
                else "check the server's log"
            )
            raise ServerUnavailableError(
                f"cannot read {base_url}{route} ({type(error).__name__}: {error}); {fix}"
            ) from None
        if reply.status == 404:
            last = f"{route}: HTTP 404"
            continue
        if reply.status in (401, 403):
            raise auth_error(base_url, reply.status, api_key_env)
        if reply.status != 200:
            raise ServerRefusedError(f"{base_url}{route}: HTTP {reply.status}")
        body = reply.json(base_url)
        if not isinstance(body, dict):
            raise ServerError(reply.wrong_shape(base_url, "an object", body))
        return body
    raise ServerRefusedError(f"{base_url}: no server_info endpoint ({last})")


def wait_for_health(
    client: httpx.Client,
    base_url: str,
    *,
    deadline_s: float,
    poll_interval_s: float = 5.0,
    on_progress: ProgressCallback | None = None,
    process: subprocess.Popen[bytes] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Poll ``/health`` until 200; returns the seconds waited.

    Raises ``LaunchError`` when ``process`` exits first or ``deadline_s`` passes.
    """
    start = clock()
    while True:
        if process is not None and process.poll() is not None:
            raise LaunchError(
                f"sglang exited with code {process.returncode} before {base_url}/health "
                "answered. Fix: read the server output above"
            )
        ready, seen = probe_health(client, base_url)
        elapsed = clock() - start
        if ready:
            if on_progress is not None:
                on_progress(f"{base_url}/health ready after {elapsed:.0f}s")
            return elapsed
        if elapsed >= deadline_s:
            raise LaunchError(
                f"{base_url}/health not ready after {deadline_s:.0f}s (last: {seen}). "
                "Fix: read the server output; loading ~600 GB of weights can take a while, "
                "raise the deadline"
            )
        if on_progress is not None:
            on_progress(f"waiting for {base_url}/health: {seen} ({elapsed:.0f}s)")
        sleep(max(0.0, min(poll_interval_s, deadline_s - elapsed)))


def check_running_server(
    client: httpx.Client,
    base_url: str,
    *,
    expected_model: str | None,
    bf16_bytes_per_token: int | None,
    kv_heads: int | None = None,
    expected_version: str | None = None,
    api_key_env: str = "SGLANG_API_KEY",
    deadline_s: float = CONTROL_DEADLINE_S,
) -> tuple[ServerFacts, GuardVerdict]:
    """Fetch ``/server_info`` (within ``deadline_s``) and judge it (what ``check-server``
    needs)."""
    info = fetch_server_info(client, base_url, api_key_env, deadline_s)
    facts = ServerFacts.from_server_info(info)
    verdict = evaluate_kv_guard(
        facts,
        expected_model=expected_model,
        bf16_bytes_per_token=bf16_bytes_per_token,
        kv_heads=kv_heads,
    )
    if expected_version and facts.version and facts.version != expected_version:
        note = (
            f"server runs sglang {facts.version}, the profile was checked against "
            f"{expected_version}"
        )
        verdict = verdict.model_copy(update={"notes": [*verdict.notes, note]})
    return facts, verdict
