"""Quality flags on every record: cheap detectors that run on the hot path, on token ids.

A flag marks data a drafter should probably not learn from, or a consumer must handle with care;
the record is still written (the data is what the model produced). A record holds them as an
object of booleans, every flag present (``RecordFlags`` in rundir/lines.py, whose field names
must be these). Flags (docs/run-directory.md):

* ``truncated``: ``finish_reason`` is ``length``: cut at ``max_new_tokens``; a drafter trained on
  it learns never to stop.
* ``empty``: no token but the stop token.
* ``degenerate``: the answer ends in a loop: its last tokens repeat with a fixed period. Found on
  ``output_ids``, never on text (a loop of tokens that decode to whitespace is still a loop).
* ``roundtrip_mismatch``: decoding the output and encoding the text again does not give the same
  ids. A text-based trainer would train on other ids than the model produced.
* ``unbalanced_think``: a think block was opened (in the output, or by the chat template at the end
  of the prompt) and never closed.

Measured recall and false-positive rates are in docs/quality.md (``tests/test_flags.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eagledata.rundir.lines import FLAG_NAMES

TRUNCATED = "truncated"
EMPTY = "empty"
DEGENERATE = "degenerate"
ROUNDTRIP_MISMATCH = "roundtrip_mismatch"
UNBALANCED_THINK = "unbalanced_think"
ALL_FLAGS = (TRUNCATED, EMPTY, DEGENERATE, ROUNDTRIP_MISMATCH, UNBALANCED_THINK)
# A record holds every flag as a field of ``RecordFlags`` (rundir/lines.py, the lower layer):
# a detector's flag the record cannot hold would fail every record it fires on.
if set(ALL_FLAGS) != set(FLAG_NAMES):  # pragma: no cover - a contract edited on one side only
    raise ImportError(f"quality flags {ALL_FLAGS} differ from the record's {FLAG_NAMES}")

THINK_OPEN_TOKENS = ("<think>", "<|thinking|>", "◁think▷")
THINK_CLOSE_TOKENS = ("</think>", "<|/thinking|>", "◁/think▷")


@dataclass(frozen=True, slots=True)
class LoopRule:
    """When the tail of an answer counts as a loop.

    The last ``span`` tokens must repeat with a period ``p`` (``1 <= p <= max_period``) where
    ``span >= max(min_repeats * p, min_tokens)``. ``min_tokens`` keeps short runs that ordinary
    text has ("!!!", a row of ``----``) from firing at small periods; ``min_repeats`` keeps a
    sentence quoted twice from firing at long ones.
    """

    max_period: int = 256
    min_repeats: int = 3
    min_tokens: int = 32


DEFAULT_LOOP_RULE = LoopRule()


def loop_period(ids: Sequence[int], rule: LoopRule = DEFAULT_LOOP_RULE) -> int | None:
    """The shortest period with which ``ids`` ends in a loop, or None.

    Cost: one slice comparison per candidate period, each at most ``min_repeats * max_period``
    ids long (C speed): well under a millisecond for an ordinary answer.
    """
    n = len(ids)
    if n < rule.min_tokens:
        return None
    tail = list(ids[-min(n, rule.min_repeats * rule.max_period + rule.max_period) :])
    size = len(tail)
    for period in range(1, rule.max_period + 1):
        span = max(rule.min_repeats * period, rule.min_tokens)
        if span > size:
            break
        # ids[i] == ids[i - period] for every i of the last (span - period) positions
        if tail[size - span + period :] == tail[size - span : size - period]:
            return period
    return None


def think_open_at_end(ids: Sequence[int], open_id: int, close_id: int) -> bool:
    """Is a think block open after ``ids`` (the last think token is an opening one)?"""
    for token in reversed(ids):
        if token == open_id:
            return True
        if token == close_id:
            return False
    return False


@dataclass(frozen=True, slots=True)
class FlagDetector:
    """Computes the flags of one answer. Build it once per run (``from_vocab``).

    ``roundtrip`` maps output ids to decode-then-encode ids (the tokenizer's own); without it
    the ``roundtrip_mismatch`` detector is off. Without think tokens in the vocabulary
    ``unbalanced_think`` is off.
    """

    think_open: int | None = None
    think_close: int | None = None
    roundtrip: Callable[[list[int]], list[int]] | None = None
    loop_rule: LoopRule = DEFAULT_LOOP_RULE

    @classmethod
    def from_vocab(
        cls,
        token_id: Callable[[str], int | None],
        roundtrip: Callable[[list[int]], list[int]] | None,
    ) -> FlagDetector:
        """Find the think tokens by name (``token_id`` returns None for an unknown token)."""
        pair: tuple[int | None, int | None] = (None, None)
        for open_name, close_name in zip(THINK_OPEN_TOKENS, THINK_CLOSE_TOKENS, strict=True):
            opened, closed = token_id(open_name), token_id(close_name)
            if opened is not None and closed is not None:
                pair = (opened, closed)
                break
        return cls(think_open=pair[0], think_close=pair[1], roundtrip=roundtrip)

    def flags(
        self,
        *,
        input_ids: Sequence[int],
        output_ids: list[int],
        finish_reason: str,
        matched: int | str | None,
    ) -> list[str]:
        found: list[str] = []
        # The answer proper: the matched stop token is the end marker, not content.
        content = output_ids
        if finish_reason == "stop" and isinstance(matched, int) and output_ids[-1:] == [matched]:
            content = output_ids[:-1]
        if finish_reason == "length":
            found.append(TRUNCATED)
        if not content:
            found.append(EMPTY)
        elif loop_period(content, self.loop_rule) is not None:
            found.append(DEGENERATE)
        if content and self.roundtrip is not None and self.roundtrip(content) != content:
            found.append(ROUNDTRIP_MISMATCH)
        if self._think_unbalanced(input_ids, content):
            found.append(UNBALANCED_THINK)
        return found

    def _think_unbalanced(self, input_ids: Sequence[int], content: list[int]) -> bool:
        opened, closed = self.think_open, self.think_close
        if opened is None or closed is None:
            return False
        # Reasoning templates often end the prompt with the opening tag: the answer then holds
        # only the closing one. Look at the prompt only if the answer does not decide it.
        if opened in content or closed in content:
            return think_open_at_end(content, opened, closed)
        return think_open_at_end(input_ids[-64:], opened, closed)
