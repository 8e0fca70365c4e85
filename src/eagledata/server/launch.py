"""``launch-server``: start SGLang from a profile, wait until it serves, check its KV cache.

The command is ``scripts/launch_sglang.sh`` followed by the profile's flags in the spelling of the
SGLang release that is launched (the installed one, or ``--sglang-version``;
``profiles/releases.py``, ``server/launch_release.py``), then any extra arguments (argparse lets
the last occurrence win, so extras override the profile). Before anything starts, the whole
argument list is checked (``server/launch_args.py``: bf16 KV or nothing); after start-up the
``/health`` poll and the bf16 guard on ``/server_info`` are ``server/readiness.py``'s.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from eagledata.config import shipped_path
from eagledata.errors import LaunchError
from eagledata.profiles.kv import KVModel
from eagledata.profiles.profile import NodeRank, Profile
from eagledata.server.launch_args import KV_REASON, check_server_args, model_from_argv
from eagledata.server.readiness import ProgressCallback, check_running_server, wait_for_health
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import GuardVerdict

DEFAULT_SCRIPT = Path("scripts/launch_sglang.sh")


def default_script() -> Path:
    """``./scripts/launch_sglang.sh`` when the working directory has one, else the shipped one."""
    if DEFAULT_SCRIPT.is_file():
        return DEFAULT_SCRIPT
    return shipped_path(DEFAULT_SCRIPT.as_posix()) or DEFAULT_SCRIPT


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


def format_command(command: Sequence[str]) -> str:
    """The command as one shell-quoted line (what ``--dry-run`` prints)."""
    return shlex.join(command)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies, which hold nothing, left out)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: is anything of the group left at all?
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def stop_process(process: subprocess.Popen[bytes], *, timeout_s: float = 30.0) -> int | None:
    """Stop a server we started, its whole process group: SIGTERM, SIGKILL after ``timeout_s``.

    Returns once no process of the group is left, not when its first process ends: SGLang's
    scheduler and detokenizer processes are children that may outlive the process we started by
    a moment, holding the GPU memory the next start needs."""
    pgid = process.pid  # start_process made it the leader of a group of its own
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None and not group_members(pgid):
            return process.returncode
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        except PermissionError:
            process.send_signal(sig)
        deadline = time.monotonic() + timeout_s
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
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
    kv = KVModel.from_section(
        profile.model, base_dir=str(Path(profile.source).parent) if profile.source else ""
    )
    kv_heads = kv.num_kv_heads if kv.attention == "mha" else None  # the guard splits them
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
            bf16_bytes_per_token=kv.guard_bytes_per_token,
            kv_heads=kv_heads,
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
