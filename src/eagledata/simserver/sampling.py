"""``sampling_params`` validation, the way SGLang checks them, and the resolved token budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from eagledata.simserver.config import SimConfig
from eagledata.simserver.protocol import SimRequestError, bad_body, bad_value

KNOWN_SAMPLING_KEYS = frozenset(
    [
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "stop",
        "stop_regex",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "n",
        "sampling_seed",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "logit_bias",
        "custom_params",
        "stream_interval",
        "beam_width",
        "watermark",
        "choice",
    ]
)


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    max_new_tokens: int | None
    min_new_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    no_stop_trim: bool
    n: int
    stream_interval: int
    greedy: bool
    sampling_key: bytes
    """Everything that changes which tokens get sampled, serialized for hashing."""


def _typed(raw: dict[str, Any], key: str, kinds: type | tuple[type, ...], noun: str) -> Any:
    """``raw[key]`` or None; a bool or any other type than ``kinds`` is a 400 ErrorResponse."""
    value = raw.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        raise bad_body(f"sampling_params.{key}: expected {noun}, got {value!r}")
    return value


def _number(raw: dict[str, Any], key: str, default: float) -> float:
    value = _typed(raw, key, (int, float), "a number")
    return default if value is None else float(value)


def _integer(raw: dict[str, Any], key: str, default: int) -> int:
    value = _typed(raw, key, int, "an integer")
    return default if value is None else int(value)


def parse_sampling(raw: object, vocab_size: int) -> SamplingSpec:
    """Validate one ``sampling_params`` dict the way SGLang does (S23 unknown-key check)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad_body("sampling_params must be an object or a list of objects")
    unknown = sorted(set(raw) - KNOWN_SAMPLING_KEYS)
    if unknown:
        raise SimRequestError(
            400, {"error": f"Unknown sampling parameter(s): {', '.join(unknown)}"}, plain_http=True
        )
    temperature = _number(raw, "temperature", 1.0)
    top_p = _number(raw, "top_p", 1.0)
    top_k = _integer(raw, "top_k", -1)
    min_p = _number(raw, "min_p", 0.0)
    freq = _number(raw, "frequency_penalty", 0.0)
    pres = _number(raw, "presence_penalty", 0.0)
    rep = _number(raw, "repetition_penalty", 1.0)
    # an explicit null means "up to the context limit"; absent means 128
    null_max = "max_new_tokens" in raw and raw["max_new_tokens"] is None
    max_new = None if null_max else _integer(raw, "max_new_tokens", 128)
    min_new = _integer(raw, "min_new_tokens", 0)
    n = _integer(raw, "n", 1)
    seed = _integer(raw, "sampling_seed", -1)
    interval = _integer(raw, "stream_interval", 1)
    checks = [
        (temperature < 0.0, f"temperature must be non-negative, got {temperature}."),
        (not 0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}."),
        (not 0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}."),
        (top_k < 1 and top_k != -1, f"top_k must be -1 (disable), or at least 1, got {top_k}."),
        (not -2.0 <= freq <= 2.0, f"frequency_penalty must be in [-2, 2], got {freq}."),
        (not -2.0 <= pres <= 2.0, f"presence_penalty must be in [-2, 2], got {pres}."),
        (not 0.0 <= rep <= 2.0, f"repetition_penalty must be in [0, 2], got {rep}."),
        (max_new is not None and max_new < 0, f"max_new_tokens must be at least 0, got {max_new}."),
        (
            min_new < 0 or (max_new is not None and min_new > max_new),
            f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.",
        ),
        (n < 1, f"n must be at least 1, got {n}."),
    ]
    for failed, message in checks:
        if failed:
            raise bad_value(message)
    stops = raw.get("stop_token_ids") or []
    if not isinstance(stops, list) or any(type(s) is not int for s in stops):
        raise bad_body("sampling_params.stop_token_ids must be a list of integers")
    for key in raw.get("logit_bias") or {}:
        if not str(key).isdigit() or int(key) >= vocab_size:
            raise bad_value(f"logit_bias must has keys in [0, {vocab_size}), got {key}.")
    greedy = temperature < 1e-6
    key_fields: list[float | None] = [temperature, top_p, top_k, min_p]
    if greedy:  # greedy ignores the other sampling knobs
        key_fields = [0.0, 1.0, 1, 0.0]
    key_fields += [freq, pres, rep, seed]
    return SamplingSpec(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        stop_token_ids=tuple(stops),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        no_stop_trim=bool(raw.get("no_stop_trim", False)),
        n=n,
        stream_interval=max(1, interval),
        greedy=greedy,
        sampling_key=orjson.dumps(key_fields),
    )


def resolve_max_new(spec: SamplingSpec, prompt_len: int, config: SimConfig) -> int:
    if spec.max_new_tokens is None:
        return max(0, config.context_length - prompt_len - 1)
    return spec.max_new_tokens
