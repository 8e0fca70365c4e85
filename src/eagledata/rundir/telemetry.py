"""``telemetry.jsonl``: the servers' load, sampled every few seconds, bounded in size.

One JSON line per lane (a server, or one DP rank of it) per sample, in the schema of
``docs/run-directory.md``. When the file passes ``max_bytes`` it becomes ``telemetry.1.jsonl``
(replacing the previous one) and a new file starts: at most twice ``max_bytes`` on disk however
long the run. ``status`` reads the last whole line per lane (``rundir/status.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from eagledata.rundir.lines import LineError, TelemetryLine

TELEMETRY_FILE = "telemetry.jsonl"
ROTATED_FILE = "telemetry.1.jsonl"
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class TelemetryLog:
    """Appends whole lines (one ``write`` each); rotates past ``max_bytes``."""

    def __init__(self, run_dir: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = run_dir / TELEMETRY_FILE
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._size = 0

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def append(self, entry: TelemetryLine) -> None:
        line = entry.dump() + b"\n"
        fd = self._open()
        if self._size and self._size + len(line) > self.max_bytes:
            os.close(fd)
            self._fd = None
            os.replace(self.path, self.path.with_name(ROTATED_FILE))
            fd = self._open()
        os.write(fd, line)
        self._size += len(line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_telemetry(run_dir: Path) -> Iterator[TelemetryLine]:
    """Every whole line that parses, oldest first (the rotated file, then the live one)."""
    for name in (ROTATED_FILE, TELEMETRY_FILE):
        path = run_dir / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            with contextlib.suppress(LineError):
                yield TelemetryLine.parse(line)


def lane_name(server: str, rank: int | None) -> str:
    """A lane's name: its server, and its DP rank when the server has several (each rank has a
    controller and a pool of its own, so one must not hide the others)."""
    return server if rank is None else f"{server} rank {rank}"
