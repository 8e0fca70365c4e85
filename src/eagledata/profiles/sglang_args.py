"""What a profile's ``[sglang_args]`` may hold: flag names as SGLang spells them (canonical, not
owned elsewhere, never ``false``), the keys it must have, and what a speculative profile must
spell out. ``Profile`` (``profiles/profile.py``) refuses a profile with any of these problems."""

from __future__ import annotations

import re
from collections.abc import Mapping

from eagledata.profiles.sections import DraftSection

ArgValue = str | int | float | bool | list[str | int | float]

_FLAG_KEY = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

# Keys a profile must spell canonically: the planner and the guard read them by these names.
_CANONICAL_KEYS = {
    "model": "model-path",
    "tensor-parallel-size": "tp-size",
    "tp": "tp-size",
    "data-parallel-size": "dp-size",
    "dp": "dp-size",
    "decode-context-parallel-size": "dcp-size",
}
# Keys owned elsewhere or refused outright.
_FORBIDDEN_KEYS = {
    "host": "set [server] host instead",
    "port": "set [server] port instead",
    "config": "a --config YAML file can set the KV cache dtype out of sight; put flags here",
    "quantization-param-path": "KV scaling factors exist only for an fp8 KV cache",
    "attn-dp-size": (
        "write dp-size N with enable-dp-attention = true; launch-server spells it "
        "--attn-dp-size N for the releases that take that"
    ),
    "node-rank": "each node's own: launch-server --node-rank R (write nnodes here)",
    "dist-init-addr": "the first node's address: launch-server --dist-init-addr HOST:PORT",
    "nccl-init-addr": "the first node's address: launch-server --dist-init-addr HOST:PORT",
}


_SPECULATIVE_SHAPE_KEYS = (
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
)


def arg_key_problems(args: Mapping[str, ArgValue]) -> list[str]:
    """What is wrong with the keys of ``[sglang_args]`` (one line each; none: nothing)."""
    problems: list[str] = []
    for key, value in args.items():
        if not _FLAG_KEY.match(key):
            problems.append(f"{key!r} is not a flag name (write tp-size, not --tp-size)")
        elif key in _CANONICAL_KEYS:
            problems.append(f"{key!r}: write {_CANONICAL_KEYS[key]!r}")
        elif key in _FORBIDDEN_KEYS:
            problems.append(f"{key!r} is not allowed: {_FORBIDDEN_KEYS[key]}")
        elif value is False:
            problems.append(f"{key!r} = false: delete the key to leave a flag off")
    for key in ("model-path", "kv-cache-dtype", "mem-fraction-static"):
        if key not in args:
            problems.append(f"{key!r} is required")
    return problems


def speculative_problems(args: Mapping[str, ArgValue], draft: DraftSection | None) -> list[str]:
    """What a profile that turns speculative decoding on must spell out and does not: the
    planner's ``[draft]`` facts, the draft's shape, ``max-running-requests``."""
    problems: list[str] = []
    algorithm = args.get("speculative-algorithm")
    if algorithm is None:
        if draft is not None:
            problems.append("[draft] needs sglang_args.speculative-algorithm")
        return problems
    if algorithm not in ("EAGLE3", "EAGLE"):
        problems.append("sglang_args.speculative-algorithm: the planner models EAGLE/EAGLE3")
    if draft is None:
        problems.append("speculative-algorithm needs a [draft] table (the planner's facts)")
    elif draft.name != args.get("speculative-draft-model-path"):
        problems.append("draft.name must equal sglang_args.speculative-draft-model-path")
    for key in _SPECULATIVE_SHAPE_KEYS:
        value = args.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"sglang_args.{key}: set it (a positive integer)")
    if "max-running-requests" not in args:
        problems.append(
            "sglang_args.max-running-requests: set it; SGLang resets it to 48 under "
            "speculative decoding"
        )
    steps, topk = args.get("speculative-num-steps"), args.get("speculative-eagle-topk")
    tokens = args.get("speculative-num-draft-tokens")
    if topk == 1 and isinstance(steps, int) and tokens != steps + 1:
        problems.append(
            "sglang_args.speculative-num-draft-tokens: with top-k 1 SGLang forces it to "
            "num-steps + 1; write that"
        )
    return problems
