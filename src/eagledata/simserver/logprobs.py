"""Logprobs for the simulated server: SGLang 0.5.9's request fields and ``meta_info`` shapes, a
deterministic model distribution, bf16 batch noise, MoE routing flips, and the silent degradation.

Request fields (S9 ``io_struct.py``): ``return_logprob``, ``logprob_start_len`` (default -1: one
input triple on 0.5.9, none from 0.5.10), ``top_logprobs_num``, ``return_text_in_logprobs``;
scalars or one entry per prompt. Answer (S9 ``tokenizer_manager.py``): ``input_token_logprobs``
is ``[[logprob, token_id, text|null], ...]`` for ``input_ids[s:]`` whose entry 0 is always
``[null, input_ids[s], null]``; ``output_token_logprobs`` one triple per output id;
``input_top_logprobs`` / ``output_top_logprobs`` one list of ``top_logprobs_num`` triples per
position (``null`` for input entry 0). A start past the prompt is a 400.

The vocabulary's last id reads 0 in ``input_token_logprobs``, and there only: every supported
release (0.5.9 ``scheduler_output_processor_mixin.py``, 0.5.15.post1 and 0.5.23
``scheduler_components/logprob_result_processor.py``) clips the input ids it reports with
``x if x < vocab_size - 1 else 0`` ("padded hash values from image tokens"), ``vocab_size`` the
model config's (its embedding rows, not its tokenizer's). The logprob at that position is still
the last id's own; the top-k lists and the output triples carry the ids the model computed.

The model (no weights, no per-token Python): at each position the next-token distribution puts
20 candidates on a geometric ladder of logits whose rung gap (the model's confidence) and ids come
from a hash of the previous token; the token actually at the position sits on a rung drawn from a
hash of (previous, token), usually the top one; the rest of the vocabulary shares a tail. So a
fixed text always scores the same, up to the noise below:

* **batch noise**: every logit gets N(0, ``logprob_noise``) per request, as bf16 kernels whose
  reduction order depends on the batch give (sglang #37292: ~1e-2 nats per token);
* **routing flips**: a position's logits all move by N(0, 0.4) with ``routing_flip_rate``, an MoE
  near-tie routed to other experts;
* **silent degradation** (``degraded``): positions that read pooled KV (every decode step; a
  prefill's scored tokens only when part of the prompt came from the cache, ``cached_tokens > 0``)
  get a fixed per-(context, candidate) perturbation N(0, ``degrade_sigma``) and the token's own
  logit lowered by ``degrade_shift``, as an fp8 or corrupted cache makes the model less sure of
  what it used to say. A cold prefill reads its neighbours' K/V in flight, never from the pool:
  it is blind to the degradation, as on SGLang's MLA path (docs/sglang.md, "Which KV a scored
  token reads").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eagledata.simserver.protocol import bad_body, bad_value

CANDIDATES = 20
MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    start: int
    top: int
    text: bool


def _per_prompt(obj: dict[str, Any], key: str, count: int, default: Any) -> list[Any]:
    value = obj.get(key, default)
    if isinstance(value, list):
        if len(value) != count:
            raise bad_value(f"{key} must be a scalar or one entry per prompt.")
        return value
    return [value] * count


def parse_logprob_requests(
    obj: dict[str, Any], prompts: list[list[int]], version: tuple[int, ...], supported: bool
) -> list[LogprobRequest | None]:
    """One entry per prompt: None when logprobs are not asked for (or not supported)."""
    count = len(prompts)
    wanted = _per_prompt(obj, "return_logprob", count, False)
    starts = _per_prompt(obj, "logprob_start_len", count, -1)
    tops = _per_prompt(obj, "top_logprobs_num", count, 0)
    text = bool(obj.get("return_text_in_logprobs", False))
    out: list[LogprobRequest | None] = []
    for ids, want, start, top in zip(prompts, wanted, starts, tops, strict=True):
        if not want or not supported:
            out.append(None)
            continue
        if type(start) is not int or type(top) is not int or top < 0:
            raise bad_body("logprob_start_len and top_logprobs_num must be integers")
        if start == -1:  # S9: the last input token; 0.5.10+: none
            start = len(ids) - 1 if version < (0, 5, 10) else len(ids)
        if start > len(ids) or start < 0:
            raise bad_value(
                f"logprob_start_len ({start}) is higher than the number of input tokens "
                f"({len(ids)}). Request with a lower logprob_start_len."
            )
        out.append(LogprobRequest(start, top, text))
    return out


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a good 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & MASK64
        return z ^ (z >> np.uint64(31))


def _uniform(*keys: np.ndarray) -> np.ndarray:
    h = np.zeros(np.broadcast(*keys).shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for key in keys:
            h = _mix(h ^ key.astype(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _normal(*keys: np.ndarray) -> np.ndarray:
    u1 = np.maximum(_uniform(*keys, np.array(1, dtype=np.uint64)), 1e-12)
    u2 = _uniform(*keys, np.array(2, dtype=np.uint64))
    return np.asarray(np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2))


@dataclass(frozen=True, slots=True)
class Noise:
    sigma: float
    flip_rate: float
    degrade_shift: float
    degrade_sigma: float
    rng: np.random.Generator


def score(
    prev: list[int], cur: list[int], vocab: int, noise: Noise, degraded: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logprob of each ``cur[i]`` after ``prev[i]``, and each position's candidates, best first:
    (token logprobs [n], candidate ids [n, 20], candidate logprobs [n, 20])."""
    p = np.asarray(prev, dtype=np.uint64)[:, None]
    c = np.asarray(cur, dtype=np.uint64)[:, None]
    n = len(prev)
    rungs = np.arange(CANDIDATES, dtype=np.uint64)[None, :]
    gap = 0.4 + 3.0 * _uniform(p, np.array(7, dtype=np.uint64))
    logits = -gap * rungs.astype(np.float64)
    ids = (10 + _mix(_mix(p) ^ rungs) % np.uint64(max(vocab - 10, 1))).astype(np.int64)
    rank = np.minimum(
        np.floor(-np.log(np.maximum(_uniform(p, c), 1e-12)) / 1.2), CANDIDATES - 1
    ).astype(np.int64)[:, 0]
    rows = np.arange(n)
    cur_ids = np.asarray(cur, dtype=np.int64)
    # The token itself sits on its rung; a candidate elsewhere with its id takes another id
    # (a top-k list never names a token twice).
    twin = (ids == cur_ids[:, None]) & (np.arange(CANDIDATES)[None, :] != rank[:, None])
    ids[twin] = (ids[twin] + 1 - 10) % max(vocab - 10, 1) + 10
    ids[rows, rank] = cur_ids
    if noise.sigma > 0:
        logits = logits + noise.rng.normal(0.0, noise.sigma, size=logits.shape)
    if noise.flip_rate > 0:
        flips = noise.rng.random(n) < noise.flip_rate
        logits[flips] += noise.rng.normal(0.0, 0.4, size=(int(flips.sum()), CANDIDATES))
    if degraded:
        logits = logits + noise.degrade_sigma * _normal(p, rungs)
        logits[rows, rank] -= noise.degrade_shift
    tail = logits[:, -1] - 2.0 + np.log(max(vocab - CANDIDATES, 1))
    top = logits.max(axis=1)
    total = top + np.log(np.exp(logits - top[:, None]).sum(axis=1) + np.exp(tail - top))
    lps = logits - total[:, None]
    order = np.argsort(-lps, axis=1, kind="stable")
    return lps[rows, rank], np.take_along_axis(ids, order, 1), np.take_along_axis(lps, order, 1)


def reported_input_id(token: int, vocab: int) -> int:
    """The id SGLang reports for input token ``token`` in ``input_token_logprobs``: the model's
    last id (and anything past it) as 0."""
    return token if token < vocab - 1 else 0


def _triples(lps: np.ndarray, ids: list[int], decode: Any) -> list[list[Any]]:
    return [
        [float(lp), int(t), decode([int(t)]) if decode else None]
        for lp, t in zip(lps, ids, strict=True)
    ]


def _tops(top_ids: np.ndarray, top_lps: np.ndarray, k: int, decode: Any) -> list[list[list[Any]]]:
    return [
        _triples(row_lps[:k], list(row_ids[:k]), decode)
        for row_ids, row_lps in zip(top_ids, top_lps, strict=True)
    ]


def logprob_meta(
    request: LogprobRequest,
    input_ids: list[int],
    output_ids: list[int],
    *,
    vocab: int,
    noise: Noise,
    degraded: bool,
    cached: int,
    decode: Any,
) -> dict[str, Any]:
    """The ``meta_info`` logprob fields of one answer (SGLang 0.5.9 shapes)."""
    text = decode if request.text else None
    k = min(request.top, CANDIDATES)
    s = request.start
    scored_prev, scored_cur = input_ids[s:-1], input_ids[s + 1 :]
    # A prefill's scored tokens read pooled KV only where part of the prompt came from the cache.
    lp_in, in_ids, in_lps = score(scored_prev, scored_cur, vocab, noise, degraded and cached > 0)
    meta: dict[str, Any] = {}
    reported = [reported_input_id(token, vocab) for token in input_ids[s:]]
    head = [None, reported[0], decode([reported[0]]) if text else None] if reported else None
    meta["input_token_logprobs"] = ([head] if head else []) + _triples(lp_in, reported[1:], text)
    out_prev = [input_ids[-1], *output_ids[:-1]]
    lp_out, out_ids, out_lps = score(out_prev, output_ids, vocab, noise, degraded)
    meta["output_token_logprobs"] = _triples(lp_out, output_ids, text)
    if request.top > 0:
        meta["input_top_logprobs"] = ([None] if head else []) + _tops(in_ids, in_lps, k, text)
        meta["output_top_logprobs"] = _tops(out_ids, out_lps, k, text)
    else:
        meta["input_top_logprobs"] = []
        meta["output_top_logprobs"] = []
    return meta


def trim_to_output(meta: dict[str, Any], kept: int) -> dict[str, Any]:
    """An aborted answer keeps part of its output: its output logprobs are cut the same way."""
    out = dict(meta)
    for key in ("output_token_logprobs", "output_top_logprobs"):
        if isinstance(out.get(key), list):
            out[key] = out[key][:kept]
    return out
