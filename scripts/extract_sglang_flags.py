#!/usr/bin/env python3
"""Regenerate an SGLang flag contract (tests/data/sglang-<version>-server_args.json).

Reads ``sglang/srt/server_args.py`` from a downloaded wheel statically (no torch needed) and
writes every ``launch_server`` flag with its literal choices. Usage::

    pip download --no-deps sglang==0.5.9 -d /tmp/sglang
    python scripts/extract_sglang_flags.py /tmp/sglang/sglang-0.5.9-py3-none-any.whl

The version is taken from the wheel's file name unless ``--version`` is given; a plain
``server_args.py`` path works too (then ``--version`` is required).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import zipfile
from pathlib import Path

from eagledata.server.sglang_flags import contract_path, extract_contract

SERVER_ARGS = "sglang/srt/server_args.py"
MIN_FLAGS = 100  # every supported release (0.5.9 .. 0.5.15.post1) has 300+


def read_source(path: Path) -> bytes:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return wheel.read(SERVER_ARGS)
    return path.read_bytes()


def version_from_wheel(path: Path) -> str | None:
    parts = path.name.split("-")
    if path.suffix == ".whl" and len(parts) >= 2 and parts[0] == "sglang":
        return parts[1]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an sglang wheel or a server_args.py file")
    parser.add_argument("--version", help="the sglang version (default: from the wheel name)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "tests" / "data",
        help="where to write sglang-<version>-server_args.json (default: tests/data)",
    )
    parser.add_argument(
        "--min-flags",
        type=int,
        default=MIN_FLAGS,
        help=f"fail when fewer flags are found (default {MIN_FLAGS})",
    )
    args = parser.parse_args(argv)

    version = args.version or version_from_wheel(args.source)
    if version is None:
        print("extract_sglang_flags: pass --version for a plain source file", file=sys.stderr)
        return 2
    raw = read_source(args.source)
    digest = hashlib.sha256(raw).hexdigest()[:16]
    origin = f"sglang=={version} {SERVER_ARGS} sha256:{digest}"
    contract = extract_contract(raw.decode("utf-8"), sglang_version=version, origin=origin)
    if len(contract.flags) < args.min_flags:
        # 0.5.23 moved the fields into sglang/srt/arg_groups/fields/*.py (msgspec structs),
        # which this extractor does not follow; never write a contract that silently lacks flags.
        print(
            f"extract_sglang_flags: only {len(contract.flags)} flags found in {SERVER_ARGS}; "
            "this release declares its flags elsewhere and needs a newer extractor",
            file=sys.stderr,
        )
        return 1

    out = contract_path(args.out_dir, version)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(contract.dumps(), encoding="utf-8")
    print(f"{out}: {len(contract.flags)} flags, {len(contract.names)} spellings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
