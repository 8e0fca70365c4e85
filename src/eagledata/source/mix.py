"""Several datasets in one run: ``--dataset`` repeated, or a ``[mixes.NAME]`` table.

Each dataset keeps its name (it starts its records' ids) and its own generation settings; the
plan takes rows from the datasets in turn, one at a time (so a run stopped halfway holds every
dataset in its share). A dataset of a ``[mixes.NAME]`` gives a row count or a share of its rows:

* a share ``s`` keeps each row whose seeded hash (seed, dataset, row index) falls below ``s``;
* a count ``n`` keeps exactly ``n`` of its ``N`` rows, each with the chance left (selection
  sampling, Knuth's Algorithm S), drawn from a generator seeded by (seed, dataset). ``N`` is
  counted first, so a count needs a local file whose rows count cheaply (``source/formats.py``).

Both read the rows once, in order, in constant memory, and choose the same rows on every read:
``resume`` plans exactly what ``generate`` planned.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass

from eagledata.config import AppConfig, FrozenSettings, GenerationSettings, MixMember
from eagledata.errors import BadRowError, ConfigError, DatasetError
from eagledata.source.conversations import split_turns
from eagledata.source.dataset import (
    ROW_ID_SCHEME,
    SourceRow,
    count_rows,
    iter_rows,
    resolve_dataset,
)
from eagledata.source.formats import one_of, suffixes
from eagledata.source.prompts import row_messages


@dataclass(frozen=True)
class Mix:
    """The datasets of one run and how many of their rows it takes."""

    name: str
    members: tuple[MixMember, ...]
    seed: int = 0
    id_scheme: int = ROW_ID_SCHEME
    """How rows without an id are named (``dataset.ROW_ID_SCHEME``): the scheme the run
    started with (``run.json``'s ``row_id_scheme``; 1 where it holds none)."""

    @classmethod
    def of(cls, frozen: FrozenSettings) -> Mix:
        return cls(frozen.dataset_name, tuple(frozen.members()), frozen.mix_seed)

    @property
    def names(self) -> list[str]:
        return [member.name for member in self.members]


def resolve_mix(arguments: list[str], config: AppConfig) -> Mix:
    """``--dataset`` values (config names, mix names, files, hub ids) as the run's datasets."""
    if not arguments:
        raise ConfigError("pass --dataset NAME (a dataset or mix of the config, a file, a hub id)")
    members: list[MixMember] = []
    seed = 0
    for argument in arguments:
        mix = config.mixes.get(argument)
        if mix is None:
            try:
                dataset = resolve_dataset(argument, config.datasets)
            except DatasetError as exc:
                if not config.mixes or not str(exc).startswith("unknown dataset"):
                    raise
                mixes = ", ".join(sorted(config.mixes))
                raise DatasetError(f"{exc} (or a mix: {mixes})") from None
            members.append(MixMember(name=dataset.name, dataset=dataset.settings))
            continue
        seed = mix.seed
        for name, amount in mix.datasets.items():
            dataset = resolve_dataset(name, config.datasets)
            rows, share = (amount, None) if isinstance(amount, int) else (None, amount)
            members.append(
                MixMember(name=dataset.name, dataset=dataset.settings, rows=rows, share=share)
            )
    names = [member.name for member in members]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(
            f"dataset {repeated[0]!r} is given twice; a run takes each dataset once (a mix "
            "names a share or a row count per dataset)"
        )
    if len(arguments) == 1:
        name = arguments[0] if arguments[0] in config.mixes else members[0].name
    else:
        name = "+".join(names)
    return Mix(name, tuple(members), seed)


def _share_keeps(seed: int, name: str, index: int, share: float) -> bool:
    digest = hashlib.blake2b(f"{seed}/{name}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest) / 2**64 < share


def member_rows(
    member: MixMember, seed: int, row_limit: int | None, id_scheme: int = ROW_ID_SCHEME
) -> Iterator[SourceRow]:
    """The rows the run takes of one dataset, in the dataset's order."""
    rows = iter_rows(member.dataset, row_limit, id_scheme=id_scheme)
    if member.share is not None:
        share = member.share
        yield from (row for row in rows if _share_keeps(seed, member.name, row.index, share))
        return
    if member.rows is None:
        yield from rows
        return
    total = count_rows(member.dataset, row_limit)
    if total is None:
        raise DatasetError(
            f"dataset {member.name}: a row count ({member.rows}) needs its rows counted first; "
            f"use a local {one_of(suffixes(countable=True))} file, or give a share "
            "(0 < share <= 1) instead"
        )
    wanted = min(member.rows, total)
    rng = random.Random(f"{seed}/{member.name}")
    taken = 0
    for seen, row in enumerate(rows):
        if taken >= wanted:
            return
        if rng.random() * (total - seen) < wanted - taken:
            taken += 1
            yield row


def mix_rows(mix: Mix, row_limit: int | None) -> Iterator[tuple[MixMember, SourceRow]]:
    """Rows of every dataset, one from each in turn until each has given what it gives."""
    streams = [
        (member, member_rows(member, mix.seed, row_limit, mix.id_scheme)) for member in mix.members
    ]
    if len(streams) == 1:  # one dataset: its rows, without the turn-taking
        member, rows = streams[0]
        yield from ((member, row) for row in rows)
        return
    while streams:
        still: list[tuple[MixMember, Iterator[SourceRow]]] = []
        for member, rows in streams:
            row = next(rows, None)
            if row is not None:
                still.append((member, rows))
                yield member, row
        streams = still


def member_row_count(member: MixMember, row_limit: int | None) -> int | None:
    """The rows the run takes of one dataset (a share: its expected count); None when its rows
    are not cheap to count."""
    rows = count_rows(member.dataset, row_limit)
    if rows is None:
        return None
    if member.rows is not None:
        return min(rows, member.rows)
    if member.share is not None:
        return round(rows * member.share)
    return rows


def estimate_items(mix: Mix, generation: GenerationSettings, row_limit: int | None) -> int | None:
    """What the plan will hold, for the progress bar before it is read to its end: rows times
    samples (a share by its expected count), and for a dataset that regenerates every turn its
    turns (its rows are read once more for it, only where they are cheap to count). None when a
    dataset's rows are not."""
    total = 0
    for member in mix.members:
        settings = member.dataset.generation(generation)
        rows = member_row_count(member, row_limit)
        if rows is None:
            return None
        if settings.turns == "all":
            rows = sum(
                _turns_of(row, member)
                for row in member_rows(member, mix.seed, row_limit, mix.id_scheme)
            )
        total += rows * settings.samples_per_prompt
    return total


def _turns_of(row: SourceRow, member: MixMember) -> int:
    """The turns a row plans under ``turns = "all"`` (a row that cannot be read plans one)."""
    if row.data is None:
        return 1
    try:
        return max(1, len(split_turns(row_messages(row.data, member.dataset))))
    except BadRowError:
        return 1
