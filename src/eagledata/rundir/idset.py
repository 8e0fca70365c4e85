"""A set of item ids at 16 bytes an id, for the done set and the plan's seen rows.

A Python ``set[str]`` of ids like ``sharegpt/row-123456/0`` costs about 100 B an id (the string
object plus its hash-table slot): 100 MB at a million prompts, on every resume. This set keeps two
64-bit hashes of each id in sorted numpy arrays instead (16 B an id), with the newest additions in a
small ordinary set that is merged into the arrays when it fills up.

Why two hashes: a false "already done" would drop an item from the plan, which breaks exactly-once
(invariant 3). With one 64-bit hash the chance of any such collision is about
``done * queries / 2**64`` (5e-8 at a million of each); with two independent ones it is about
``1e12 / 2**128``, never in practice. The hashes are Python's own (SipHash), keyed per process:
the set lives in one process and is never stored.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

_SALT = "\x1f"  # the second hash is of the id with this suffix: independent of the first


class CompactIdSet:
    """Membership and size of a set of ids, at about 16 B an id. Ids can be added, not removed."""

    def __init__(self, ids: Iterable[str] = (), *, buffer_size: int = 1 << 16) -> None:
        self._buffer_size = buffer_size
        self._primary: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._secondary: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._views = (self._primary.data, self._secondary.data)
        self._recent: set[str] = set()
        # hashed but not yet sorted in: ``update`` hashes in bulk and sorts once, at the first read
        self._unsorted: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        self.update(ids)

    def add(self, item_id: str) -> None:
        # No lookup in the arrays here: a repeat is dropped when the buffer is merged.
        self._recent.add(item_id)
        if len(self._recent) >= self._buffer_size:
            self._unsorted.append(_hash_all(list(self._recent)))
            self._recent = set()
            self._merge()

    def update(self, ids: Iterable[str]) -> None:
        """Add many ids: hashed a chunk at a time, sorted in once, when the set is next read."""
        chunk: list[str] = []
        for item_id in ids:
            chunk.append(item_id)
            if len(chunk) >= self._buffer_size:
                self._unsorted.append(_hash_all(chunk))
                chunk = []
        if chunk:
            self._unsorted.append(_hash_all(chunk))

    def __contains__(self, item_id: object) -> bool:
        # the hot path of a plan: one call per row, so no call that is not needed
        if not isinstance(item_id, str):
            return False
        if item_id in self._recent:
            return True
        if self._unsorted:
            self._merge()
        return self._in_arrays(item_id)

    def __len__(self) -> int:
        if self._recent:
            self._unsorted.append(_hash_all(list(self._recent)))
            self._recent = set()
        self._merge()
        return len(self._primary)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (the buffer of recent ids is bounded by ``buffer_size``)."""
        return int(self._primary.nbytes + self._secondary.nbytes)

    def _in_arrays(self, item_id: str) -> bool:
        # bisect over memoryviews: plain Python ints, about 3x faster than numpy scalar calls
        primary, secondary = self._views
        size = len(primary)
        if not size:
            return False
        first = hash(item_id)
        index = bisect.bisect_left(primary, first)
        if index == size or primary[index] != first:
            return False
        second = hash(item_id + _SALT)
        while index < size and primary[index] == first:
            if secondary[index] == second:
                return True
            index += 1
        return False

    def _merge(self) -> None:
        if not self._unsorted:
            return
        primary = np.concatenate([self._primary, *(p for p, _ in self._unsorted)])
        secondary = np.concatenate([self._secondary, *(s for _, s in self._unsorted)])
        self._unsorted = []
        # A stable sort finds the sorted run already there: merging a chunk costs about O(n).
        order = np.argsort(primary, kind="stable")
        primary, secondary = primary[order], secondary[order]
        # Drop repeats (an id added twice). Equal first hashes sit together; a repeat is an equal
        # pair. Two different ids sharing a first hash and interleaving with a repeat would keep
        # the repeat in the count: a 2**-64 event that can never drop an id, only count one twice.
        keep = np.ones(len(primary), dtype=bool)
        keep[1:] = (primary[1:] != primary[:-1]) | (secondary[1:] != secondary[:-1])
        self._primary = primary[keep]
        self._secondary = secondary[keep]
        self._views = (self._primary.data, self._secondary.data)


def _hash_all(ids: list[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    count = len(ids)
    primary = np.fromiter(map(hash, ids), dtype=np.int64, count=count)
    secondary = np.fromiter(map(hash, (item_id + _SALT for item_id in ids)), np.int64, count)
    return primary, secondary
