"""Builds a venv that runs the real SGLang 0.5.23 server on a CPU-only machine (stdlib only).

    python scripts/sglang_cpu_env.py            # build (or find) it; prints its python
    python scripts/sglang_cpu_env.py --model D  # and a tiny random-weight Llama in D

The venv holds exactly the packages of ``scripts/sglang_cpu/requirements.txt``, each installed
``--no-deps`` so pip never resolves sglang's own pins (torch 2.14.1's CUDA build, flashinfer,
...): torch is the CPU wheel on this machine's disk, installed ``--no-index`` first, so a
machine without it fails at once instead of downloading GBs. Then the two files SGLang's CPU
engine needs beside its own (``scripts/sglang_cpu/``): a pure-PyTorch ``sgl_kernel`` and a
start-up hook that lets the registry's torchvision import beside the CPU torch.

It lives in ``~/.cache/eagledata-tests/sglang-0.5.23-cpu`` (``EAGLEDATA_TEST_CACHE`` moves the
folder), is built under a temporary name and a file lock (a concurrent build waits for the
first) and renamed when whole, and is rebuilt when its pins, its overlay files or the Python
building it change. A rerun that finds it built returns at once. pip's own cache keeps the
downloaded wheels, so a rebuild downloads nothing new.

The tests import this module (``tests/realserver.py``); :class:`RegistryUnreachable` tells
them the package registry could not be reached, the one reason the real-server tier skips.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

SGLANG_VERSION = "0.5.23"
HERE = Path(__file__).resolve().parent
OVERLAY = HERE / "sglang_cpu"
PINS = OVERLAY / "requirements.txt"
# What goes into the venv's site-packages beside the pinned packages.
OVERLAY_FILES = ("sgl_kernel", "eagledata_torchvision_ops.py", "eagledata_torchvision_ops.pth")
RANDOM_LLAMA = OVERLAY / "random_llama.py"
CACHE = Path(os.environ.get("EAGLEDATA_TEST_CACHE", Path.home() / ".cache" / "eagledata-tests"))
VENV = CACHE / f"sglang-{SGLANG_VERSION}-cpu"
BUILD_TIMEOUT_S = 1800
# What pip prints when it cannot reach the registry (as tests/trainerkit.py reads it).
UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "Connection refused",
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Imported once after the build: proves the venv whole, and writes the bytecode of what the
# server imports (pip compiled none of it), which takes a fresh venv's first start from ~50 s.
SMOKE = (
    "import sgl_kernel, torchvision, sglang.launch_server, sglang.srt.entrypoints.http_server, "
    "sglang.srt.managers.scheduler, sglang.srt.managers.detokenizer_manager, "
    "sglang.srt.model_executor.model_runner, sglang.srt.models.llama"
)


class SetupError(RuntimeError):
    """The venv could not be built (the message says what failed and what pip said)."""


class RegistryUnreachable(SetupError):
    """The package registry could not be reached: the venv cannot be built on this machine."""


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a server of this venv runs in: SGLang's CPU engine, offline."""
    environ = dict(os.environ if base is None else base)
    environ.update(OFFLINE, SGLANG_USE_CPU_ENGINE="1")
    # One OpenMP thread per process unless told otherwise: on 2 shared cores (several servers
    # and clients at load 15-30) torch's threads spin waiting for one another and a server
    # decoded 3-10 tok/s; with one thread, 130-160 tok/s on the same machine.
    environ.setdefault("OMP_NUM_THREADS", "1")
    environ.pop("PYTHONDONTWRITEBYTECODE", None)  # let the venv keep its bytecode
    return environ


def python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def stamp() -> str:
    """What the venv's packages were built from: its pins and the Python building it."""
    digest = hashlib.sha256(PINS.read_bytes()).hexdigest()[:16]
    return f"{digest} {sys.version.split()[0]} {sys.base_prefix}"


def overlay_stamp() -> str:
    """The overlay files' contents: a change re-copies them (seconds), no rebuild."""
    digest = hashlib.sha256()
    for path in _overlay_paths():
        digest.update(str(path.relative_to(OVERLAY)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _overlay_paths() -> Iterator[Path]:
    for name in OVERLAY_FILES:
        path = OVERLAY / name
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            yield path


def is_built(venv: Path = VENV) -> bool:
    done, overlay = venv / ".complete", venv / ".overlay"
    return (
        done.is_file()
        and done.read_text() == stamp()
        and overlay.is_file()
        and overlay.read_text() == overlay_stamp()
    )


def ensure_venv(venv: Path = VENV, log: Callable[[str], None] = print) -> Path:
    """The venv, built the first time (minutes: see docs/sglang.md); its directory."""
    if is_built(venv):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if is_built(venv):
            return venv
        done = venv / ".complete"
        if done.is_file() and done.read_text() == stamp():
            _install_overlay(venv)  # the packages are right, the overlay files changed
            log(f"updated the CPU stand-ins in {venv}")
            return venv
        building = venv.with_name(f"{venv.name}.building")
        shutil.rmtree(building, ignore_errors=True)
        started = time.monotonic()
        try:
            _build(building, log)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        (building / ".build-seconds").write_text(f"{seconds:.0f}\n")
        (building / ".complete").write_text(stamp())
        (building / ".overlay").write_text(overlay_stamp())
        shutil.rmtree(venv, ignore_errors=True)
        building.rename(venv)  # `python -m` finds its prefix from the interpreter's path
        log(f"built {venv} in {seconds:.0f} s")
    return venv


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python(venv)), "-m", "pip", "--disable-pip-version-check", "install", "--quiet",
         "--no-deps", "--no-compile", *args],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip


def _pins() -> list[str]:
    lines = (line.split("#")[0].strip() for line in PINS.read_text().splitlines())
    return [line for line in lines if line]


def _build(venv: Path, log: Callable[[str], None]) -> None:
    log(f"building the SGLang {SGLANG_VERSION} CPU venv in {venv} (minutes the first time)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pins = _pins()
    torch = next((pin for pin in pins if pin.startswith("torch==")), None)
    if torch is None:
        raise SetupError(f"{PINS} pins no torch==")
    result = _pip(venv, "--no-index", torch)
    if result.returncode != 0:
        raise SetupError(
            f"{torch} (its CPU build) is not among pip's local wheels (find-links); the real "
            "server is run on this machine's CPU torch, never a download from an index. "
            f"pip said:\n{result.stdout}{result.stderr}"
        )
    result = _pip(venv, *(pin for pin in pins if pin != torch))
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if any(marker in output for marker in UNREACHABLE):
            raise RegistryUnreachable(
                f"cannot reach the package registry to install {PINS.relative_to(HERE.parent)}"
            )
        raise SetupError(f"pip install --no-deps -r {PINS} failed:\n{output}")
    _install_overlay(venv)
    result = subprocess.run(
        [str(python(venv)), "-c", SMOKE], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
        env=server_env(), check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SetupError(f"the SGLang venv does not import its server:\n{result.stderr[-4000:]}")


def _install_overlay(venv: Path) -> None:
    site = next((venv / "lib").glob("python3*/site-packages"))
    for name in OVERLAY_FILES:
        source, target = OVERLAY / name, site / name
        if source.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    (venv / ".overlay").write_text(overlay_stamp())


def build_random_model(tokenizer_dir: Path, out: Path, venv: Path = VENV) -> Path:
    """A tiny Llama with random weights and ``tokenizer_dir``'s files in ``out`` (once)."""
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    building = out.with_name(f"{out.name}.building")
    shutil.rmtree(building, ignore_errors=True)
    result = subprocess.run(
        [str(python(venv)), str(RANDOM_LLAMA), str(tokenizer_dir), str(building)],
        capture_output=True, text=True, timeout=600, env=server_env(), check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SetupError(f"building the random Llama failed:\n{result.stderr[-4000:]}")
    shutil.rmtree(out, ignore_errors=True)
    building.rename(out)
    return out


# The launch every server of this venv gets: the CPU engine's working set (no AMX here, so
# torch_native attention; no CUDA graphs; the overlap scheduler off), a bf16 KV cache, the
# metrics, and the request log that tests read as the ground truth of what the server did.
BASE_FLAGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
    "--disable-overlap-schedule", "--enable-metrics", "--log-requests", "--log-requests-level",
    "3", "--log-requests-format", "json",
)  # fmt: skip
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """One real SGLang server of the venv, in a process group of its own.

    Started by :meth:`start`; ready when ``/health`` answers 200 (after SGLang's own warm-up
    request). :meth:`stop` sends SIGTERM to the whole group (HTTP server, scheduler and
    detokenizer) and SIGKILL after ``STOP_TIMEOUT_S``. Its console goes to ``workdir/server.log``,
    its request log to ``workdir/requests/``.
    """

    def __init__(
        self,
        model_dir: Path,
        workdir: Path,
        *,
        kv_cache_dtype: str = "bf16",
        max_total_tokens: int = 4096,
        extra_flags: tuple[str, ...] = (),
        venv: Path = VENV,
    ) -> None:
        self.model_dir = model_dir
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.request_log_dir = workdir / "requests"
        self.console = workdir / "server.log"
        self.argv = [
            str(python(venv)), "-m", "sglang.launch_server", "--model-path", str(model_dir),
            "--host", "127.0.0.1", "--port", str(self.port), *BASE_FLAGS,
            "--log-requests-target", str(self.request_log_dir),
            "--kv-cache-dtype", kv_cache_dtype, "--max-total-tokens", str(max_total_tokens),
            *extra_flags,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_seconds: float | None = None

    def start(self, ready_timeout: float = READY_TIMEOUT_S) -> Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.request_log_dir.mkdir(exist_ok=True)
        started = time.monotonic()
        with self.console.open("ab") as console:
            self.process = subprocess.Popen(
                self.argv, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=server_env(), start_new_session=True, cwd=self.workdir,
            )  # fmt: skip
        deadline = started + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SetupError(
                    f"the SGLang server exited with {self.process.returncode} before it was "
                    f"ready; its log ({self.console}) ends:\n{self.console_tail()}"
                )
            if self._healthy():
                self.ready_seconds = time.monotonic() - started
                return self
            time.sleep(0.5)
        self.stop()
        raise SetupError(
            f"the SGLang server was not ready within {ready_timeout:.0f} s; its log "
            f"({self.console}) ends:\n{self.console_tail()}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def console_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Ends the server and every process of its group; its exit code (None if killed)."""
        process = self.process
        if process is None:
            return None
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                continue
            _wait_group_gone(process.pid, timeout)
            if signum == signal.SIGTERM and _group_alive(process.pid):
                continue  # the leader left, a child did not: SIGKILL the rest
            return code
        return None

    def __enter__(self) -> Server:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", type=Path, help="also write a tiny random-weight Llama here")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=HERE.parent / "src" / "eagledata" / "assets" / "tokenizer" / "tiny-chatml",
        help="the tokenizer the random Llama is built for (default: the bundled ChatML one)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        venv = ensure_venv(log=lambda line: print(line, file=sys.stderr))
        if args.model is not None:
            build_random_model(args.tokenizer, args.model, venv)
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{python(venv)}  ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
