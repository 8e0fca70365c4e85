"""Deterministic generation: what the simulated server answers for a prompt.

Outputs are a pure function of (prompt ids, sampling params that change sampling, seed, sample
index, effective KV dtype): a blake2b digest picks a length and an offset into a fixed table of
valid ids, so no request costs per-token Python work.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from typing import Any

import orjson

from eagledata.profiles.releases import release_for
from eagledata.simserver.answers import EMPTY, LOOP, draw_shape, loop_answer
from eagledata.simserver.config import SimConfig
from eagledata.simserver.model import TABLE_SIZE, ModelSpec, resolve_model
from eagledata.simserver.protocol import FinishReason
from eagledata.simserver.sampling import SamplingSpec, parse_sampling, resolve_max_new


def prompt_digest(input_ids: list[int]) -> bytes:
    return hashlib.blake2b(array("q", input_ids).tobytes(), digest_size=16).digest()


def _body(
    model: ModelSpec, offset: int, count: int, banned: frozenset[int], whole_words: bool = False
) -> list[int]:
    """``count`` ids of the table from the word start at or after ``offset``; with
    ``whole_words`` (an answer that stops) cut back to end before a word start, so it never stops
    in the middle of a word or of a UTF-8 character."""
    table = model.table
    offset = model.snap(offset)
    if whole_words and count > 1 and offset + count < TABLE_SIZE:
        count = max(1, model.snap_back(offset + count) - offset)
    if offset + count <= TABLE_SIZE:
        ids = table[offset : offset + count]
    else:
        ids = (table[offset:] + table * (count // TABLE_SIZE + 1))[:count]
    if banned and not banned.isdisjoint(ids):
        safe = next(t for t in table if t not in banned)
        ids = [safe if t in banned else t for t in ids]
    return ids


def degraded_answer(
    model: ModelSpec, ids: list[int], h: bytes, banned: frozenset[int], finish: FinishReason
) -> list[int]:
    """What a silently degraded server decodes instead: the same answer for a while (the
    first tokens read little pooled KV), then other tokens; same length and finish."""
    body_end = len(ids) - (1 if finish.get("type") == "stop" else 0)
    if body_end <= 1:
        return ids
    keep = 1 + int.from_bytes(h[8:10]) % max(1, body_end // 3)
    other = _body(model, int.from_bytes(h[10:14]) ^ 0x5A5A5A, body_end - keep, banned)
    if other and other[0] == ids[keep]:
        other[0] = next(t for t in model.table if t != ids[keep] and t not in banned)
    return [*ids[:keep], *other, *ids[body_end:]]


def answer_hash(
    digest: bytes, spec: SamplingSpec, config: SimConfig, index: int, fp8: bool
) -> bytes:
    salt = orjson.dumps([config.seed, index, fp8])
    return hashlib.blake2b(digest + spec.sampling_key + salt, digest_size=16).digest()


def answer_shape(
    digest: bytes, spec: SamplingSpec, config: SimConfig, index: int, max_new: int
) -> str | None:
    """``empty``, ``loop`` or None: the shape this answer takes (answers.py). An answer that
    cannot stop (``ignore_eos``) is never empty; one shorter than 8 tokens never loops."""
    if not (config.empty_rate or config.loop_rate) or spec.ignore_eos:
        return None
    h = answer_hash(digest, spec, config, 0 if spec.greedy else index, False)
    shape = draw_shape(h, config.empty_rate, config.loop_rate)
    if (shape == EMPTY and max_new < 1) or (shape == LOOP and max_new < 8):
        return None
    return shape


def generate(
    model: ModelSpec,
    digest: bytes,
    spec: SamplingSpec,
    max_new: int,
    config: SimConfig,
    *,
    fp8: bool,
    sample_index: int = 0,
    prompt_len: int = 0,
    degraded: bool | None = None,
    think_state: str = "none",
    long_answer: bool = False,
) -> tuple[list[int], FinishReason]:
    """The deterministic output of one sample; ``max_new`` is already resolved. ``degraded``:
    whether its DP rank is (``config.degraded`` when not given); ``think_state``: how the
    prompt leaves thinking (``ModelSpec.think_state``); ``long_answer``: the prompt holds
    ``output_len_long_token`` (``asks_long_answer``)."""
    index = 0 if spec.greedy else sample_index
    h = answer_hash(digest, spec, config, index, fp8)
    offset = int.from_bytes(h[:4]) % TABLE_SIZE
    pick = int.from_bytes(h[4:12])
    stops = () if spec.ignore_eos else (model.eos_token_id, *spec.stop_token_ids)
    banned = frozenset(spec.stop_token_ids) - {model.eos_token_id}
    lo, hi = max(1, spec.min_new_tokens), max_new - 1
    runs_long = pick % 1_000_000 < config.length_fraction * 1_000_000
    if max_new == 0:
        ids: list[int] = []
        finish: FinishReason = {"type": "length", "length": 0}
    elif not stops or runs_long or lo > hi:
        ids = _body(model, offset, max_new, banned)
        finish = {"type": "length", "length": max_new}
    else:
        length = lo + (pick >> 20) % (hi - lo + 1)
        if config.output_len_mean is not None:
            length = _modelled_length(config, prompt_len, pick, lo, hi, long_answer)
        at_limit = (pick >> 40) % 1_000_000 < config.stop_at_limit_fraction * 1_000_000
        if at_limit:
            length = max_new  # the stop token is the last id the budget allows: exactly
        stop = stops[(pick >> 8) % len(stops)] if len(stops) > 1 else stops[0]
        ids = _body(model, offset, length - 1, banned, whole_words=not at_limit)
        ids.append(stop)
        finish = {"type": "stop", "matched": stop}
    if config.think_share and model.think is not None and ids and think_state != "off":
        opened = think_state == "open"
        ids = _thinking(ids, finish, model.think, config.think_share, max_new, opened)
    shape = answer_shape(digest, spec, config, index, max_new)
    if shape == EMPTY:
        ids, finish = [stops[0]], {"type": "stop", "matched": stops[0]}
    elif shape == LOOP:
        ids = loop_answer(_body(model, offset, max_new, banned), h, max_new)
        finish = {"type": "length", "length": max_new}
    if (config.degraded if degraded is None else degraded) and ids:
        ids = degraded_answer(model, ids, h, banned, finish)
    if finish["type"] == "stop" and len(ids) == max_new and length_checked_first(config):
        finish = {"type": "length", "length": max_new}  # the stop id stays the last id
    if fp8:
        twin = generate(
            model, digest, spec, max_new, config, fp8=False, sample_index=index,
            prompt_len=prompt_len, degraded=degraded, think_state=think_state,
            long_answer=long_answer,
        )  # fmt: skip
        if twin[0] == ids and ids:  # fp8 must visibly differ from bf16: nudge the first token
            ids[0] = next(t for t in model.table if t != ids[0] and t not in banned)
    return ids, finish


def length_checked_first(config: SimConfig) -> bool:
    """Does the release report an answer whose stop token is its ``max_new``-th id as cut at
    the length (0.5.9, 0.5.15.post1), not as stopped (0.5.23)?"""
    return release_for(config.version)[0].server.finish_at_limit == "length"


def _thinking(
    ids: list[int],
    finish: FinishReason,
    think: tuple[int, int],
    share: float,
    max_new: int,
    opens_think: bool,
) -> list[int]:
    """A thinking model's answer: the first ``share`` of it inside a think block. Never longer
    than ``max_new``: a stopping answer gives up body ids for its tags, a cut one is all
    thinking (cut before its think block closes)."""
    opened, closed = think
    lead = [] if opens_think else [opened]
    if finish.get("type") != "stop":
        return (lead + ids)[:max_new]
    body, stop = ids[:-1], ids[-1:]
    room = max_new - len(lead) - 1 - len(stop)
    if room < 0:  # no room for the tags: an answer without thinking
        return ids
    body = body[:room]
    cut = round(len(body) * share)
    return [*lead, *body[:cut], closed, *body[cut:], *stop]


def asks_long_answer(config: SimConfig, input_ids: list[int]) -> bool:
    """Does this prompt get ``output_len_long_mean`` (it holds ``output_len_long_token``)?"""
    token = config.output_len_long_token
    return token is not None and config.output_len_long_mean is not None and token in input_ids


def _modelled_length(
    config: SimConfig, prompt_len: int, pick: int, lo: int, hi: int, long_answer: bool = False
) -> int:
    """The answer length of the benchmark workloads (``output_len_mean``, or
    ``output_len_long_mean`` for a prompt that asks for it): a mean that may grow with the
    prompt, spread uniformly by +- ``output_len_spread``."""
    base = config.output_len_long_mean if long_answer else None
    mean = (base or config.output_len_mean or 0.0) + config.output_len_per_prompt_token * prompt_len
    u = ((pick >> 20) % 1_000_003) / 1_000_002
    if config.output_len_shape == "exponential":
        length = round(-mean * math.log1p(-min(u, 0.999_999)))
    else:
        length = round(mean * (1.0 + config.output_len_spread * (2.0 * u - 1.0)))
    return max(lo, min(hi, length))


def expected_output(
    input_ids: list[int],
    sampling_params: dict[str, Any] | None,
    config: SimConfig,
    *,
    sample_index: int = 0,
) -> tuple[list[int], FinishReason]:
    """What the sim answers for these ids and params under ``config`` (incl. its KV dtype)."""
    model = resolve_model(config)
    spec = parse_sampling(sampling_params, model.vocab_size)
    max_new = resolve_max_new(spec, len(input_ids), config)
    return generate(
        model,
        prompt_digest(input_ids),
        spec,
        max_new,
        config,
        fp8=config.is_fp8(),
        sample_index=sample_index,
        prompt_len=len(input_ids),
        think_state=model.think_state(input_ids),
        long_answer=asks_long_answer(config, input_ids),
    )
