"""The command line both asset builders share: write OUT, or --check that OUT matches a rebuild."""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def rebuild_main(
    description: str,
    write: Callable[[Path], None],
    files: Sequence[str],
    default_out: Path,
    argv: list[str] | None = None,
) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", nargs="?", type=Path, default=default_out)
    parser.add_argument(
        "--check", action="store_true", help="rebuild into a temp dir and compare with OUT"
    )
    args = parser.parse_args(argv)
    if not args.check:
        write(args.out)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
        _, mismatch, errors = filecmp.cmpfiles(tmp, args.out, files, shallow=False)
    if mismatch or errors:
        print(f"{args.out} differs from a rebuild: {mismatch + errors}", file=sys.stderr)
        return 1
    print(f"{args.out} matches a rebuild")
    return 0
