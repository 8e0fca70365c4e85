"""``launch-server``: start SGLang from a profile, wait until it serves, check its KV cache.

The command is ``scripts/launch_sglang.sh`` followed by the profile's flags in the spelling of the
SGLang release that is launched (the installed one, or ``--sglang-version``;
``profiles/releases.py``), then any extra arguments (argparse lets the last occurrence win, so
extras override the profile). Before
anything starts, the whole argument list is checked: a KV cache dtype other than bf16, an
fp8-scales file, a draft KV dtype other than bf16 (``--speculative-draft-kv-cache-dtype``,
0.5.23) or a ``--config`` YAML (which could set the dtype out of sight) is refused with
``LaunchError``. The shell script repeats the dtype check as a second line of defence, and after
start-up the server's own ``/server_info`` goes through the bf16 guard.

Argument matching follows argparse, including unambiguous prefixes (``--kv-cache fp8_e4m3``
means ``--kv-cache-dtype fp8_e4m3`` to SGLang) and the ``--flag=value`` form.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from eagledata.config import shipped_path
from eagledata.errors import (
    ConfigError,
    LaunchError,
    ServerRefusedError,
    ServerUnavailableError,
)
from eagledata.profiles.kv import KVModel
from eagledata.profiles.profile import BF16_KV_DTYPES, NodeRank, Profile
from eagledata.server.answers import auth_error
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import GuardVerdict, evaluate_kv_guard

DEFAULT_SCRIPT = Path("scripts/launch_sglang.sh")


def default_script() -> Path:
    """``./scripts/launch_sglang.sh`` when the working directory has one, else the shipped one."""
    if DEFAULT_SCRIPT.is_file():
        return DEFAULT_SCRIPT
    return shipped_path(DEFAULT_SCRIPT.as_posix()) or DEFAULT_SCRIPT


KV_REASON = (
    "eagledata serves only a bf16 KV cache: an fp8 KV cache degraded Kimi-K2.5 "
    "(INT4 weights, compressed MLA latent) and poisons the drafter's training data"
)

_KV_FLAG = "--kv-cache-dtype"
_KV_MIN_PREFIX = len("--kv-c")
# The draft's own KV dtype (0.5.23; default: follows --kv-cache-dtype). Shortest prefix argparse
# takes for it: --speculative-draft-k (tests/test_sglang_releases.py checks both against each
# release's own parser).
_DRAFT_KV_FLAG = "--speculative-draft-kv-cache-dtype"
_DRAFT_KV_MIN_PREFIX = len("--speculative-draft-k")
_SCALES_FLAG = "--quantization-param-path"
_SCALES_MIN_PREFIX = len("--quantization-")
_CONFIG_FLAG = "--config"
_CONFIG_MIN_PREFIX = len("--conf")
# Relaxed speculative acceptance (below SGLang's default 1.0) trades the target distribution for
# speed: lossy like an fp8 KV cache (server/speculative.py). Shortest unique argparse prefixes.
_THRESHOLD_FLAGS = ("--speculative-accept-threshold-single", "--speculative-accept-threshold-acc")
_THRESHOLD_MIN_PREFIX = len("--speculative-accept-threshold-s")
_MODEL_FLAGS = ("--model-path", "--model")

ProgressCallback = Callable[[str], None]


def _is_prefix_of(name: str, flag: str, min_length: int) -> bool:
    """True when argparse could read ``name`` as ``flag`` (exact, or a long-enough prefix)."""
    return len(name) >= min_length and flag.startswith(name)


def _refuse_kv_value(flag: str, value: str) -> LaunchError:
    if flag.startswith("--speculative"):
        return LaunchError(
            f"refused {flag} {value}: the draft model's KV cache must be bf16 too ({KV_REASON}). "
            "Fix: drop it; the draft's KV dtype follows --kv-cache-dtype bf16"
        )
    if value == "auto":
        why = (
            "SGLang silently resolves 'auto' to fp8 for checkpoints that declare an fp8 KV "
            f"cache; {KV_REASON}"
        )
    else:
        why = KV_REASON
    return LaunchError(
        f"refused {flag} {value}: {why}. Fix: drop the override; every launch profile "
        f"passes {_KV_FLAG} bf16"
    )


def check_server_args(argv: Sequence[str]) -> None:
    """Raise ``LaunchError`` if ``argv`` could give SGLang anything but a bf16 KV cache."""
    seen_kv = False
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, has_value, inline = token.partition("=")
        target = _is_prefix_of(name, _KV_FLAG, _KV_MIN_PREFIX)
        if target or _is_prefix_of(name, _DRAFT_KV_FLAG, _DRAFT_KV_MIN_PREFIX):
            if has_value:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise LaunchError(f"refused {name}: it needs a value. Fix: {_KV_FLAG} bf16")
            if value not in BF16_KV_DTYPES:
                raise _refuse_kv_value(name, value)
            seen_kv = seen_kv or target
        elif _is_prefix_of(name, _SCALES_FLAG, _SCALES_MIN_PREFIX):
            raise LaunchError(
                f"refused {name}: it loads KV scaling factors, used only by an fp8 KV cache; "
                f"{KV_REASON}. Fix: remove it"
            )
        elif any(_is_prefix_of(name, f, _THRESHOLD_MIN_PREFIX) for f in _THRESHOLD_FLAGS):
            value = inline if has_value else (argv[i] if i < len(argv) else "")
            try:
                lossless = float(value) >= 1.0
            except ValueError:
                lossless = False
            if not lossless:
                raise LaunchError(
                    f"refused {name} {value}: relaxed speculative acceptance is lossy (the "
                    "answers stop following the target model's distribution). Fix: remove it; "
                    "SGLang's default 1.0 is exact"
                )
        elif _is_prefix_of(name, _CONFIG_FLAG, _CONFIG_MIN_PREFIX):
            raise LaunchError(
                f"refused {name}: a YAML config can set kv-cache-dtype out of sight of this "
                "check. Fix: put the flags in the profile's [sglang_args] or pass them as "
                "extra arguments"
            )
    if not seen_kv:
        raise LaunchError(f"refused: no {_KV_FLAG} given. Fix: pass {_KV_FLAG} bf16")


def model_from_argv(argv: Sequence[str]) -> str | None:
    """The model path SGLang will load: the last ``--model-path``/``--model`` value."""
    model: str | None = None
    for index, token in enumerate(argv):
        name, has_value, inline = token.partition("=")
        if name in _MODEL_FLAGS:
            if has_value:
                model = inline
            elif index + 1 < len(argv):
                model = argv[index + 1]
    return model


_NODE_FLAGS = {
    "--nnodes": "nnodes is the profile's ([sglang_args] nnodes)",
    "--node-rank": "pass it to launch-server itself: launch-server --node-rank R",
    "--dist-init-addr": "pass it to launch-server itself: launch-server --dist-init-addr HOST:PORT",
    "--nccl-init-addr": "pass it to launch-server itself: launch-server --dist-init-addr HOST:PORT",
}


def build_launch_command(
    profile: Profile,
    extra_args: Sequence[str] = (),
    *,
    version: str,
    script: str | Path = DEFAULT_SCRIPT,
    node: NodeRank | None = None,
) -> list[str]:
    """The exact argv to run: ``script``, the profile's flags as sglang ``version`` spells
    them, a multi-node profile's ``node`` (``--node-rank``, ``--dist-init-addr``), then
    ``extra_args``. ``ConfigError`` (one line naming the releases the profile runs on) when it
    has no form for ``version``."""
    if profile.plan_only:
        raise LaunchError(
            f"refused profile {profile.name!r}: it is plan_only, a planner comparison row that "
            f"is never launched (kv-cache-dtype {profile.kv_cache_dtype}: {KV_REASON}). "
            "Fix: launch a bf16 profile such as kimi-k25-tp8"
        )
    for token in extra_args:
        name = token.partition("=")[0]
        if name in _NODE_FLAGS:
            raise LaunchError(f"refused {name} after --: {_NODE_FLAGS[name]}")
    argv = [*profile.server_argv(version, node), *extra_args]
    check_server_args(argv)
    return [str(script), *argv]


def node_note(profile: Profile, node: NodeRank) -> str:
    """What one node of a multi-node server does, and where ``generate`` finds the server."""
    url = f"http://{node.head_host}:{profile.server.port}"
    if node.serves_http:
        where = (
            f"; it listens on {profile.server.host}: run generate on this node, or add -- --host "
            "0.0.0.0 to reach it from others"
            if profile.server.host in ("127.0.0.1", "localhost", "::1")
            else ""
        )
        others = "rank 1" if profile.nnodes == 2 else f"ranks 1-{profile.nnodes - 1}"
        return (
            f"node rank 0 of {profile.nnodes}: serves the HTTP API once every node has joined "
            f"(start node {others} with the same --dist-init-addr {node.dist_init_addr}); "
            f"eagledata generate --server {url}{where}"
        )
    return (
        f"node rank {node.rank} of {profile.nnodes}: runs its share of the model's ranks and no "
        f"HTTP API; eagledata generate talks to node rank 0 ({url}, the --dist-init-addr host), "
        "and checks it there"
    )


def start_process(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, stdout: int | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` (a server, or a node of one) in its own process group; ``stdout`` a
    file descriptor for its output (default: ours)."""
    try:
        return subprocess.Popen(
            list(command),
            start_new_session=True,
            env=None if env is None else dict(env),
            stdout=stdout,
        )
    except OSError as error:
        raise LaunchError(
            f"cannot start {command[0]}: {error.strerror or error}. Fix: run from the "
            "repository root (scripts/launch_sglang.sh) or pass the script path"
        ) from None


# --- which release is launched --------------------------------------------------------------

_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    pass\n"
)


def sglang_python(env: Mapping[str, str] | None = None) -> str:
    """The interpreter ``scripts/launch_sglang.sh`` runs SGLang with (``SGLANG_PYTHON``)."""
    return (os.environ if env is None else env).get("SGLANG_PYTHON") or "python"


def installed_sglang_version(python: str, *, timeout_s: float = 60.0) -> str | None:
    """The sglang version ``python`` has installed (read from its metadata, nothing imported);
    None when it has none, or ``python`` cannot be run."""
    try:
        done = subprocess.run(
            [python, "-c", _VERSION_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip().splitlines()
    return found[-1].strip() if done.returncode == 0 and found else None


def choose_version(
    profile: Profile,
    *,
    requested: str | None,
    installed: str | None,
    python: str,
    dry_run: bool,
) -> tuple[str, str]:
    """The release whose form of ``profile`` is rendered, and a note for stderr.

    ``--sglang-version`` (``requested``) wins; else the installed release; a dry run on a
    machine without SGLang shows the newest release the profile runs on. A release the profile
    has no form for is one ``ConfigError`` line naming those it has."""
    if requested is not None:
        profile.release(requested)
        note = f"sglang {requested} form"
        if installed is not None and installed != requested:
            note += f" (sglang {installed} is installed)"
        return requested, note
    if installed is not None:
        if installed not in profile.sglang_versions:
            try:
                profile.release(installed)
            except ConfigError as error:
                raise ConfigError(
                    f"{error} (sglang {installed} is installed for {python}). Fix: install one "
                    "of those, or pass --sglang-version V to launch V's form anyway"
                ) from None
        return installed, f"sglang {installed} (installed for {python})"
    if dry_run:
        newest = profile.newest_version
        return newest, (
            f"no sglang installed for {python} (SGLANG_PYTHON): the sglang {newest} form; "
            "--sglang-version V shows another"
        )
    raise LaunchError(
        f"no sglang installed for {python} (SGLANG_PYTHON). Fix: pip install "
        f"sglang=={profile.newest_version} (profile {profile.name} runs on "
        f"{', '.join(profile.sglang_versions)})"
    )


def format_command(command: Sequence[str]) -> str:
    """The command as one shell-quoted line (what ``--dry-run`` prints)."""
    return shlex.join(command)


# --- HTTP: the health poll and /server_info ------------------------------------------------


def probe_health(client: httpx.Client, base_url: str) -> tuple[bool, str]:
    """One ``GET /health``: ``(ready, what was seen)``. Never raises for network trouble."""
    try:
        response = client.get(f"{base_url}/health")
    except httpx.ConnectError:
        return False, "not listening yet"
    except httpx.TimeoutException:
        return False, "timed out"
    except httpx.HTTPError as error:
        return False, type(error).__name__
    if response.status_code == 200:
        return True, "HTTP 200"
    return False, f"HTTP {response.status_code}"


def fetch_server_info(
    client: httpx.Client, base_url: str, api_key_env: str = "SGLANG_API_KEY"
) -> object:
    """The JSON body of ``/server_info`` (falls back to ``/get_server_info`` on a 404). A
    refused key (401/403) is said as such, naming ``api_key_env``."""
    last = ""
    for route in ("/server_info", "/get_server_info"):
        try:
            response = client.get(f"{base_url}{route}")
        except httpx.HTTPError as error:
            fix = (
                "is an SGLang server running there? start one (eagledata launch-server) or fix "
                "the URL"
                if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)
                else "check the server's log"
            )
            raise ServerUnavailableError(
                f"cannot read {base_url}{route} ({type(error).__name__}: {error}); {fix}"
            ) from None
        if response.status_code == 404:
            last = f"{route}: HTTP 404"
            continue
        if response.status_code in (401, 403):
            raise auth_error(base_url, response.status_code, api_key_env)
        if response.status_code != 200:
            raise ServerRefusedError(f"{base_url}{route}: HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise ServerRefusedError(f"{base_url}{route}: body is not JSON") from None
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
    expected_version: str | None = None,
    api_key_env: str = "SGLANG_API_KEY",
) -> tuple[ServerFacts, GuardVerdict]:
    """Fetch ``/server_info`` and judge it (what ``check-server`` needs)."""
    facts = ServerFacts.from_server_info(fetch_server_info(client, base_url, api_key_env))
    verdict = evaluate_kv_guard(
        facts, expected_model=expected_model, bf16_bytes_per_token=bf16_bytes_per_token
    )
    if expected_version and facts.version and facts.version != expected_version:
        note = (
            f"server runs sglang {facts.version}, the profile was checked against "
            f"{expected_version}"
        )
        verdict = verdict.model_copy(update={"notes": [*verdict.notes, note]})
    return facts, verdict


# --- the launch ------------------------------------------------------------------------------


def stop_process(process: subprocess.Popen[bytes], *, timeout_s: float = 30.0) -> int | None:
    """Stop a server we started: SIGTERM to its process group, SIGKILL after ``timeout_s``."""
    if process.poll() is not None:
        return process.returncode
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            process.send_signal(sig)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
    return process.poll()


@dataclass
class LaunchResult:
    """A started server: its command, process, address, facts and guard verdict."""

    command: list[str]
    process: subprocess.Popen[bytes]
    base_url: str
    facts: ServerFacts
    verdict: GuardVerdict

    def stop(self, *, timeout_s: float = 30.0) -> int | None:
        return stop_process(self.process, timeout_s=timeout_s)


def launch_and_wait(
    profile: Profile,
    extra_args: Sequence[str] = (),
    *,
    version: str,
    script: str | Path = DEFAULT_SCRIPT,
    deadline_s: float = 1800.0,
    poll_interval_s: float = 5.0,
    on_progress: ProgressCallback | None = None,
    client: httpx.Client | None = None,
    env: Mapping[str, str] | None = None,
    stop_on_refusal: bool = True,
    node: NodeRank | None = None,
) -> LaunchResult:
    """Start the server of ``profile``, wait for ``/health``, then run the bf16 guard.

    The server runs in its own process group. If it dies, misses the deadline or answers
    ``/server_info`` badly, it is stopped and the error raised. When the guard refuses and
    ``stop_on_refusal`` is set, the server is stopped too; the result still carries the facts
    and the verdict, so the caller can print why (``result.verdict.raise_if_refused()``).
    """
    command = build_launch_command(profile, extra_args, version=version, script=script, node=node)
    expected_model = model_from_argv(command[1:])
    bf16_bytes = KVModel.from_section(
        profile.model, base_dir=str(Path(profile.source).parent) if profile.source else ""
    ).bf16_bytes_per_token
    base_url = profile.server.base_url
    if on_progress is not None:
        on_progress(f"starting: {format_command(command)}")
    process = start_process(command, env=env)

    own_client = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0))
    try:
        wait_for_health(
            http,
            base_url,
            deadline_s=deadline_s,
            poll_interval_s=poll_interval_s,
            on_progress=on_progress,
            process=process,
        )
        facts, verdict = check_running_server(
            http,
            base_url,
            expected_model=expected_model,
            bf16_bytes_per_token=bf16_bytes,
            expected_version=version,
        )
    except BaseException:
        # whatever went wrong (deadline, death, bad server_info, Ctrl-C), leave nothing running
        stop_process(process)
        raise
    finally:
        if own_client:
            http.close()

    if on_progress is not None:
        on_progress(verdict.summary())
    if not verdict.ok and stop_on_refusal:
        stop_process(process)
    return LaunchResult(
        command=command, process=process, base_url=base_url, facts=facts, verdict=verdict
    )
