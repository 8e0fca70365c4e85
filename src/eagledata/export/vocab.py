"""Counts of supervised token ids, and the draft vocabulary mapping SpecForge's EAGLE-3 needs.

SpecForge 0.2.0 refuses a disaggregated EAGLE-3 run without ``model.vocab_mapping_path``: a
``torch.save({"d2t": LongTensor[draft], "t2d": BoolTensor[target]})`` file. Its own builder
(``specforge.data.preprocessing.process_token_dict_to_mappings``) counts only ids whose
``loss_mask`` is 1, pads the counter with the lowest missing ids up to the draft size, takes
``most_common(draft)``, sorts the chosen ids, and sets ``d2t[i] = used[i] - i`` and
``t2d[j] = j in used``. Ties in ``most_common`` keep the counter's insertion order, which its
counting loop makes "row of first appearance, then ascending id" (it adds each row's
``unique(return_counts=True)``). ``count_supervised`` counts the same way, in export order, and
``draft_vocab_mapping`` repeats the rest exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import orjson

from eagledata.errors import ExportError
from eagledata.export.output import atomic_target


def count_supervised(counts: Counter[int], output_ids: Sequence[int]) -> None:
    """Add one row's supervised ids (its whole ``output_ids``, the ``loss_mask == 1`` part),
    ascending within the row, as SpecForge's ``unique(return_counts=True)`` does."""
    counts.update(dict(sorted(Counter(output_ids).items())))


def draft_vocab_mapping(
    counts: Counter[int], draft_vocab_size: int, target_vocab_size: int
) -> tuple[list[int], list[bool]]:
    if draft_vocab_size < 1 or draft_vocab_size > target_vocab_size:
        raise ExportError(
            f"--draft-vocab-size {draft_vocab_size}: must be between 1 and the target "
            f"vocabulary size {target_vocab_size}"
        )
    padded = Counter(counts)
    if len(padded) < draft_vocab_size:
        for token in sorted(set(range(draft_vocab_size)) - set(padded)):
            padded[token] = 0
            if len(padded) >= draft_vocab_size:
                break
    used = sorted(token for token, _ in padded.most_common(draft_vocab_size))
    if used and used[-1] >= target_vocab_size:
        raise ExportError(
            f"token id {used[-1]} is outside the tokenizer's vocabulary of {target_vocab_size}; "
            "export with the run's own tokenizer"
        )
    d2t = [token - index for index, token in enumerate(used)]
    chosen = set(used)
    t2d = [token in chosen for token in range(target_vocab_size)]
    return d2t, t2d


def token_counts_json(counts: Counter[int]) -> bytes:
    """``{token_id: count}`` over supervised ids, ascending ids (speculators' ``token_freq``)."""
    return orjson.dumps({str(token): count for token, count in sorted(counts.items())})


_NEEDS_TORCH = (
    "--draft-vocab-size writes a torch file and needs torch: pip install 'eagledata[draft]' "
    "(or pip install torch); or pass --token-counts and build the mapping where torch is "
    "installed"
)


def check_torch_available() -> None:
    """Fail before the export starts, not after it has streamed every record."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        raise ExportError(_NEEDS_TORCH) from None


def write_vocab_mapping(d2t: list[int], t2d: list[bool], path: Path) -> None:
    """SpecForge's ``model.vocab_mapping_path`` file: ``{"d2t": long, "t2d": bool}`` tensors."""
    try:
        import torch
    except ImportError:
        raise ExportError(_NEEDS_TORCH) from None
    mapping = {
        "d2t": torch.tensor(d2t, dtype=torch.long),
        "t2d": torch.tensor(t2d, dtype=torch.bool),
    }
    with atomic_target(path, is_dir=False) as tmp:
        torch.save(mapping, tmp)
