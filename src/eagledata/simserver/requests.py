"""Parsing a ``/generate`` body: prompts, sampling params, rids and SGLang's length checks."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from eagledata.simserver import shapes
from eagledata.simserver.engine import answer_shape, asks_long_answer, generate, prompt_digest
from eagledata.simserver.logprobs import (
    LogprobRequest,
    Noise,
    logprob_meta,
    parse_logprob_requests,
)
from eagledata.simserver.model import ModelSpec
from eagledata.simserver.protocol import bad_body, bad_value
from eagledata.simserver.sampling import SamplingSpec, parse_sampling, resolve_max_new
from eagledata.simserver.scheduler import Item
from eagledata.simserver.state import SimState


@dataclass(slots=True)
class Parsed:
    pairs: list[tuple[Item, SamplingSpec]]
    single: bool
    stream: bool
    fault_key: bytes
    logprob_meta: list[dict[str, Any] | None] = field(default_factory=list)
    """Per pair: the logprob fields of its ``meta_info`` (logprobs.py), or None."""
    prompts: list[tuple[bytes, list[int]]] = field(default_factory=list)
    """(digest, ids) of each prompt, for the prefix cache once the scheduler takes them."""
    rank: int = 0
    """The DP rank it goes to, whose prefix cache it reads and fills."""


def remember_prompts(state: SimState, parsed: Parsed) -> None:
    """The scheduler took the request: its prompts are in the prefix cache from now on (a
    request refused with 503 never is)."""
    for digest, ids in parsed.prompts:
        state.scheduler.remember_prefix(_on_rank(digest, parsed.rank))
        if not state.config.disable_radix_cache:
            state.prefix_cache(parsed.rank).insert(ids)


def remember_answers(state: SimState, parsed: Parsed) -> None:
    """Answers that finished go into the prefix cache with their prompt, all but the last id,
    as SGLang's radix cache does when a request finishes (``RadixCache.cache_finished_req``
    inserts ``(origin_input_ids + output_ids)[:-1]``): the next turn of a conversation, whose
    prompt holds this answer, finds it cached. An aborted answer is not inserted."""
    if state.config.disable_radix_cache or not parsed.prompts:
        return
    per_prompt = max(1, len(parsed.pairs) // len(parsed.prompts))
    cache = state.prefix_cache(parsed.rank)
    for index, (item, _) in enumerate(parsed.pairs):
        ids, finish = item.result()
        if finish is None or finish.get("type") == "abort" or not ids:
            continue
        prompt = parsed.prompts[index // per_prompt][1]
        cache.insert([*prompt, *ids[:-1]])


def _prompts(obj: dict[str, Any], model: ModelSpec) -> tuple[list[list[int]], bool]:
    given = [k for k in ("text", "input_ids", "input_embeds") if obj.get(k) is not None]
    if len(given) != 1:
        raise bad_value("Either text, input_ids or input_embeds should be provided (only one).")
    if given[0] == "input_embeds":
        raise bad_value("input_embeds is not supported by the simulated server.")
    value = obj[given[0]]
    if given[0] == "text":
        if isinstance(value, str):
            return [model.encode(value)], True
        if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
            return [model.encode(t) for t in value], False
        raise bad_body("text must be a string or a non-empty list of strings")
    if not isinstance(value, list) or not value:
        raise bad_value("input_ids cannot be empty.")
    single = not isinstance(value[0], list)
    prompts = [value] if single else value
    for ids in prompts:
        if not isinstance(ids, list) or not ids:
            raise bad_value("input_ids cannot be empty.")
        if set(map(type, ids)) != {int}:
            raise bad_body("input_ids must be a list of integers or a list of such lists")
        if min(ids) < 0 or max(ids) >= model.vocab_size:
            raise bad_value(f"The input_ids contain a token id outside [0, {model.vocab_size}).")
    return prompts, single


def _rids(obj: dict[str, Any], prompts: int, n: int) -> list[str]:
    rid = obj.get("rid")
    total = prompts * n
    if rid is None:
        return [os.urandom(16).hex() for _ in range(total)]
    if isinstance(rid, str):
        return [rid] if total == 1 else [f"{rid}_{i}" for i in range(total)]
    if not isinstance(rid, list) or len(rid) != prompts or not all(isinstance(r, str) for r in rid):
        raise bad_value("The rid should be a string or a list of strings, one per prompt.")
    return list(rid) if n == 1 else [f"{r}_{j}" for r in rid for j in range(n)]


def dispatch_rank(obj: dict[str, Any], state: SimState) -> int:
    """The DP rank a request goes to: its pin, else the next in round robin. Each rank (a DP
    attention rank, or a DP replica) has a radix cache of its own, so a prompt warmed on one
    rank is cold on the others. A batch body goes to one rank here (SGLang dispatches each of
    its requests)."""
    pinned = _pinned_rank(obj, state.config.dp_size, shapes.pinned_rank_keys(state.config))
    rank = pinned if pinned is not None else state.next_dp_rank()
    state.dispatched[("pinned" if pinned is not None else "round robin", rank)] += 1
    return rank


def _on_rank(digest: bytes, rank: int) -> bytes:
    return digest + rank.to_bytes(2, "big")


def _pinned_rank(obj: dict[str, Any], dp_size: int, keys: tuple[str, ...]) -> int | None:
    """``data_parallel_rank`` (0.5.9) / ``routed_dp_rank`` (0.5.15.post1; both in 0.5.23): the
    client picks the DP rank. A field the release does not know is dropped, the request left to
    round robin, as SGLang does."""
    for key in keys:
        value = obj.get(key)
        if value is not None:
            if not isinstance(value, int) or not 0 <= value < dp_size:
                raise bad_value(f"{key} {value!r} is out of range [0, {dp_size})")
            return value
    return None


def parse_generate(obj: Any, state: SimState) -> Parsed:
    if not isinstance(obj, dict):
        raise bad_body("The request body must be a JSON object.")
    config, model = state.config, state.model
    stream = bool(obj.get("stream", False))
    prompts, single = _prompts(obj, model)
    raw = obj.get("sampling_params")
    if isinstance(raw, list):
        if len(raw) != len(prompts):
            raise bad_value("sampling_params list must have one entry per prompt.")
        specs = [parse_sampling(r, model.vocab_size) for r in raw]
    else:
        specs = [parse_sampling(raw, model.vocab_size)] * len(prompts)
    n = specs[0].n
    rids = _rids(obj, len(prompts), n)
    if len(set(rids)) != len(rids):
        raise bad_value(f"Duplicate request ID in the batch: {rids}")
    if config.version_tuple() >= (0, 5, 23):
        for rid in rids:
            if rid in state.scheduler.rid_counts:
                raise bad_value(f"Duplicate request ID {rid!r}: a request with it is in flight.")
    ctx, limit = config.context_length, config.max_req_input_len()
    budgets = []
    for ids, spec in zip(prompts, specs, strict=True):
        length = len(ids)
        max_new = resolve_max_new(spec, length, config)
        if length >= ctx:
            raise bad_value(
                f"The input ({length} tokens) is longer than the model's context length "
                f"({ctx} tokens)."
            )
        if length + max_new >= ctx:
            raise bad_value(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {length + max_new} tokens: {length} tokens "
                f"from the input messages and {max_new} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the "
                "limit."
            )
        if length >= limit:
            raise bad_value(
                f"Input length ({length} tokens) exceeds the maximum allowed length ({limit} "
                "tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        budgets.append(max_new)
    pairs: list[tuple[Item, SamplingSpec]] = []
    rank = dispatch_rank(obj, state)
    fp8, dtype = config.is_fp8(), config.effective_kv_dtype()
    digests = []
    wants = parse_logprob_requests(obj, prompts, config.version_tuple(), config.logprobs_supported)
    metas: list[dict[str, Any] | None] = []
    taken: list[tuple[bytes, list[int]]] = []
    for ids, spec, max_new, want in zip(prompts, specs, budgets, wants, strict=True):
        degraded = config.degraded_on(rank, state.generations)
        if max_new > 0:
            state.generations += n
        digest = prompt_digest(ids)
        digests.append(digest + spec.sampling_key)
        repeat = any(digest == seen for seen, _ in taken)  # the same prompt earlier in the batch
        taken.append((digest, ids))
        for j in range(n):
            out, finish = generate(
                model, digest, spec, max_new, config,
                fp8=fp8, sample_index=j, prompt_len=len(ids), degraded=degraded,
                think_state=model.think_state(ids), long_answer=asks_long_answer(config, ids),
            )  # fmt: skip
            item = Item(rids[len(pairs)], len(ids), out, finish)
            shape = answer_shape(digest, spec, config, j, max_new)
            state.answers.note(item.rid, shape, degraded, time.time())
            item.max_new, item.ignore_eos, item.dp_rank = max_new, spec.ignore_eos, rank
            item.kv_dtype = dtype
            seen = state.scheduler.seen_prefix(config, _on_rank(digest, rank), len(ids))
            if (repeat or j > 0) and not config.disable_radix_cache:
                seen = len(ids) - 1
            item.cached = _cached(state, rank, ids, seen, want)
            metas.append(_logprobs(state, want, ids, out, item.cached, degraded))
            pairs.append((item, spec))
    key = hashlib.blake2b(b"".join(digests), digest_size=16).digest()
    return Parsed(pairs, single and n == 1, stream, key, metas, taken, rank)


def _cached(
    state: SimState, rank: int, ids: list[int], seen: int, want: LogprobRequest | None
) -> int:
    """The radix cache's match (prefix_cache.py); never past ``logprob_start_len``."""
    if state.config.disable_radix_cache:
        return seen
    cap = want.start if want is not None else None
    cached = max(seen, state.prefix_cache(rank).match(ids, cap))
    return cached if cap is None else min(cached, cap)


def _logprobs(
    state: SimState,
    want: LogprobRequest | None,
    ids: list[int],
    out: list[int],
    cached: int,
    degraded: bool,
) -> dict[str, Any] | None:
    if want is None:
        return None
    config = state.config
    noise = Noise(
        config.logprob_noise,
        config.routing_flip_rate,
        config.degrade_shift,
        config.degrade_sigma,
        state.noise_rng,
    )
    decode = state.model.decode if state.model.tokenizer is not None else None
    return logprob_meta(
        want,
        ids,
        out,
        vocab=state.model.vocab_size,
        noise=noise,
        degraded=degraded,
        cached=cached,
        decode=decode,
    )
