"""Reading rounds back for a trainer: typed records (``records``) and a ``datasets.Dataset`` in
the rows ``eagledata export`` writes (``dataset``: the same selection, formats and mask check).

``out`` is the folder the calls wrote (its ``round-NNNN`` run directories), or one run directory
itself (made by ``eagledata generate``). ``round=None`` reads every round, oldest first; a round
being generated is read as far as it is committed, like ``status`` reads it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagledata.errors import ExportError, RunDirError
from eagledata.export.exporter import ExportOptions, export_rows
from eagledata.export.hf import hf_features
from eagledata.library.source import round_dir, round_dirs
from eagledata.rundir.lines import RecordLine
from eagledata.rundir.reader import RunRecords

DATASET_FORMATS = ("ids", "hf", "conversations", "text")


def rounds(out: str | os.PathLike[str]) -> list[int]:
    """The rounds ``out`` holds, in order."""
    return list(round_dirs(Path(out)))


def run_dirs(out: str | os.PathLike[str], round_index: int | None = None) -> list[Path]:
    """The run directories a read covers: one round's, every round's, or ``out`` itself."""
    root = Path(out)
    if (root / "run.json").is_file():
        if round_index is not None:
            raise RunDirError(
                f"{root} is one run directory, not a folder of rounds; pass round=None"
            )
        return [root]
    if round_index is not None:
        path = round_dir(root, round_index)
        if not (path / "run.json").is_file():
            held = ", ".join(map(str, rounds(root))) or "none"
            raise RunDirError(
                f"{path} is not a round of {root} (its rounds: {held}); regenerate(..., "
                f"round={round_index}) makes it"
            )
        return [path]
    found = list(round_dirs(root).values())
    if not found:
        raise RunDirError(
            f"{root} holds no round yet; regenerate(..., out={str(root)!r}) makes one"
        )
    return found


def records(out: str | os.PathLike[str], round: int | None = None) -> Iterator[RecordLine]:
    """Every committed record of one round (or of every round, oldest first), typed: ``input_ids``
    exactly as sent, ``output_ids`` exactly as returned (docs/run-directory.md)."""
    for path in run_dirs(out, round):
        yield from RunRecords(path).records()


def dataset(
    out: str | os.PathLike[str],
    round: int | None = None,
    format: str = "ids",
    *,
    keep: tuple[str, ...] = (),
    max_length: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Any:
    """A ``datasets.Dataset`` of the rows ``eagledata export --format FORMAT`` writes (``ids``
    and ``hf``: ``input_ids``, ``loss_mask``, ``metadata``; ``hf`` adds ``seq_len``), the same
    records kept (``keep``: flags to keep, ``max_length``). Over several rounds each id starts
    with its round's folder name, as an export of several runs names them.

    Built once per state of the rounds' files and cached by ``datasets`` (in ``cache_dir``, else
    its own cache folder): calling it again on an unchanged round reads the cache."""
    from datasets import Dataset, Features
    from datasets.utils.logging import disable_progress_bar

    if format not in DATASET_FORMATS:
        raise ExportError(f"format={format!r}: use one of {', '.join(DATASET_FORMATS)}")
    paths = run_dirs(out, round)
    options = ExportOptions(format=format, keep=keep, max_length=max_length)
    features: Features | None = None
    if format in ("ids", "hf"):
        features = hf_features()
        if format == "ids":
            features.pop("seq_len")

    def rows() -> Iterator[dict[str, Any]]:
        yield from export_rows(paths, options).rows

    disable_progress_bar()
    return Dataset.from_generator(rows, features=features, fingerprint=_fingerprint(paths, options))


def _fingerprint(paths: list[Path], options: ExportOptions) -> str:
    """What the dataset is built from: the options and every committed file's name, size and
    modification time (a round that grew, or was repaired, is built again)."""
    digest = hashlib.sha256(repr(options).encode())
    for path in paths:
        run = RunRecords(path)
        digest.update(str(path.resolve()).encode())
        for file in [*run.files(), path / "failures.jsonl"]:
            if file.is_file():
                stat = file.stat()
                digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]
