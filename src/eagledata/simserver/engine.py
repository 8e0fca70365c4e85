"""Deterministic generation, request validation, faults, and the KV / queue / latency model.

Outputs are a pure function of (prompt ids, sampling params that change sampling, seed, sample
index, effective KV dtype): a blake2b digest picks a length and an offset into a fixed table of
valid ids, so no request costs per-token Python work.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from eagledata.errors import EagledataError
from eagledata.simserver.config import TABLE_SIZE, ModelSpec, SimConfig, resolve_model

FinishReason = dict[str, Any]

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


class SimRequestError(EagledataError):
    """A request the simulated server refuses; ``status`` and ``body`` are the HTTP answer."""

    def __init__(self, status: int, body: Any, *, plain_http: bool = False) -> None:
        super().__init__(orjson.dumps(body).decode())
        self.status = status
        self.body = body
        self.plain_http = plain_http
        """True when even a streaming request gets this as an HTTP error (schema checks)."""


def bad_value(message: str) -> SimRequestError:
    """The tokenizer manager's ValueError: 400 ``{"error":{"message":...}}``."""
    return SimRequestError(400, {"error": {"message": message}})


def bad_body(message: str) -> SimRequestError:
    """FastAPI's body type mismatch: 400 ErrorResponse."""
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None}
    return SimRequestError(400, {**body, "code": 400}, plain_http=True)


def queue_full_body() -> dict[str, Any]:
    msg = "The request queue is full."
    return {"object": "error", "message": msg, "type": "503", "param": None, "code": 503}


# --- sampling params ------------------------------------------------------------------------


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


def _number(raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_body(f"sampling_params.{key}: expected a number, got {value!r}")
    return float(value)


def _integer(raw: dict[str, Any], key: str, default: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_body(f"sampling_params.{key}: expected an integer, got {value!r}")
    return value


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


# --- generation -----------------------------------------------------------------------------


def prompt_digest(input_ids: list[int]) -> bytes:
    return hashlib.blake2b(array("q", input_ids).tobytes(), digest_size=16).digest()


def _body(model: ModelSpec, offset: int, count: int, banned: frozenset[int]) -> list[int]:
    table = model.table
    if offset + count <= TABLE_SIZE:
        ids = table[offset : offset + count]
    else:
        ids = (table[offset:] + table * (count // TABLE_SIZE + 1))[:count]
    if banned and not banned.isdisjoint(ids):
        safe = next(t for t in table if t not in banned)
        ids = [safe if t in banned else t for t in ids]
    return ids


def generate(
    model: ModelSpec,
    digest: bytes,
    spec: SamplingSpec,
    max_new: int,
    config: SimConfig,
    *,
    fp8: bool,
    sample_index: int = 0,
) -> tuple[list[int], FinishReason]:
    """The deterministic output of one sample; ``max_new`` is already resolved."""
    index = 0 if spec.greedy else sample_index
    salt = orjson.dumps([config.seed, index, fp8])
    h = hashlib.blake2b(digest + spec.sampling_key + salt, digest_size=16).digest()
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
        stop = stops[(pick >> 8) % len(stops)] if len(stops) > 1 else stops[0]
        ids = _body(model, offset, length - 1, banned)
        ids.append(stop)
        finish = {"type": "stop", "matched": stop}
    if fp8:
        twin = generate(model, digest, spec, max_new, config, fp8=False, sample_index=index)
        if twin[0] == ids and ids:  # fp8 must visibly differ from bf16: nudge the first token
            ids[0] = next(t for t in model.table if t != ids[0] and t not in banned)
    return ids, finish


def resolve_max_new(spec: SamplingSpec, prompt_len: int, config: SimConfig) -> int:
    if spec.max_new_tokens is None:
        return max(0, config.context_length - prompt_len - 1)
    return spec.max_new_tokens


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
    )


# --- faults ---------------------------------------------------------------------------------

FAULT_KINDS = ("fail_500", "fail_503", "reset", "stall", "abort", "bad_count", "stream_error")


def decide_faults(config: SimConfig, key: bytes, attempt: int) -> frozenset[str]:
    """Faults for one HTTP request, from (seed, request content, attempt number): reproducible
    whatever the arrival order, and a retry of the same content draws afresh."""
    if not config.any_fault():
        return frozenset()
    salt = orjson.dumps([config.seed, attempt])
    h = hashlib.blake2b(key + salt, digest_size=4 * len(FAULT_KINDS)).digest()
    chosen = set()
    for i, kind in enumerate(FAULT_KINDS):
        u = int.from_bytes(h[4 * i : 4 * i + 4]) / 2**32
        if u < float(getattr(config, f"{kind}_rate")):
            chosen.add(kind)
    return frozenset(chosen)


# --- KV / queue / latency ---------------------------------------------------------------------

QUEUED, RUNNING, DONE, ABORTED = range(4)


class Item:
    """One sample in flight: reserved KV, timer, and the future its handler awaits."""

    __slots__ = (
        "abort_finish",
        "admit_fut",
        "admitted_at",
        "cached",
        "duration",
        "finish",
        "fut",
        "keep",
        "kv_dtype",
        "output_ids",
        "prompt_len",
        "rank",
        "reserve",
        "rid",
        "state",
        "timer",
    )

    def __init__(self, rid: str, prompt_len: int, out: list[int], finish: FinishReason) -> None:
        self.rid, self.prompt_len, self.output_ids, self.finish = rid, prompt_len, out, finish
        self.reserve = prompt_len + len(out)
        self.state = QUEUED
        self.kv_dtype = "bf16"
        self.cached = 0
        self.rank = 0
        self.keep = 0
        self.admitted_at = self.duration = 0.0
        self.abort_finish: FinishReason | None = None
        self.fut: asyncio.Future[None] | None = None
        self.admit_fut: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def result(self) -> tuple[list[int], FinishReason]:
        if self.abort_finish is None:
            return self.output_ids, self.finish
        return self.output_ids[: self.keep], self.abort_finish


class QueueFullError(EagledataError):
    """The waiting queue of a DP rank is at ``max_queued_requests``."""


@dataclass(slots=True, eq=False)
class Rank:
    index: int
    used: int = 0
    running: int = 0
    queue: deque[Item] = field(default_factory=deque)


@dataclass(slots=True)
class SimStats:
    """Counters behind ``/_sim/stats`` and ``/metrics``; ``rid_kv_dtype`` is capped."""

    outcomes: Counter[str] = field(default_factory=Counter)
    by_kv_dtype: Counter[str] = field(default_factory=Counter)
    rid_kv_dtype: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    items: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    aborted_items: int = 0

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: dict(v) if isinstance(v, dict) else v for k, v in out.items()}


RID_LIMIT = 200_000


class Scheduler:
    """Admits items per DP rank while running < limit and used + reserve fits the pool (FCFS,
    head of line); the rest wait, up to ``max_queued_requests`` per rank. An admitted item
    finishes after latency_s + completion / decode speed, unless aborted first."""

    def __init__(self) -> None:
        self.ranks: list[Rank] = []
        self.live: dict[Item, None] = {}
        self.rid_counts: Counter[str] = Counter()
        self.prefix_seen: dict[bytes, None] = {}
        self.stats = SimStats()
        self._rr = 0
        self._window = (0.0, 0)
        self._last_throughput = 0.0

    def rank(self, index: int) -> Rank:
        while len(self.ranks) <= index:
            self.ranks.append(Rank(len(self.ranks)))
        return self.ranks[index]

    def note_prefix(self, config: SimConfig, digest: bytes, prompt_len: int) -> int:
        """Cached tokens of a prompt: a repeat of a seen prompt reuses all but its last token."""
        if config.disable_radix_cache:
            return 0
        if digest in self.prefix_seen:
            return prompt_len - 1
        if len(self.prefix_seen) >= RID_LIMIT:
            self.prefix_seen.clear()
        self.prefix_seen[digest] = None
        return 0

    def submit(self, items: list[Item], config: SimConfig) -> None:
        """Admit or queue every item of one HTTP request, or none (QueueFullError)."""
        now = asyncio.get_running_loop().time()
        for placed, item in enumerate(items):
            self._rr = (self._rr + 1) % config.dp_size
            rank = self.rank(self._rr)
            item.rank = rank.index
            if not rank.queue and self._fits(rank, item, config):
                self._admit(rank, item, config, now)
            elif config.max_queued_requests is not None and (
                len(rank.queue) >= config.max_queued_requests
            ):
                for other in items[:placed]:
                    self.finish(other, ABORTED, config)
                raise QueueFullError("The request queue is full.")
            else:
                rank.queue.append(item)
            self.live[item] = None
            self.rid_counts[item.rid] += 1
            self.stats.prompt_tokens += item.prompt_len
            self.stats.cached_tokens += item.cached

    def _fits(self, rank: Rank, item: Item, config: SimConfig) -> bool:
        if rank.running >= config.running_limit_per_rank():
            return False
        return rank.running == 0 or rank.used + item.reserve <= config.max_total_num_tokens

    def _admit(self, rank: Rank, item: Item, config: SimConfig, now: float) -> None:
        rank.used += item.reserve
        rank.running += 1
        item.state = RUNNING
        item.admitted_at = now
        item.duration = config.latency_s
        if config.decode_tok_per_s is not None:
            speed = config.decode_tok_per_s * min(1.0, config.decode_batch / rank.running)
            item.duration += len(item.output_ids) / speed
        if item.admit_fut is not None and not item.admit_fut.done():
            item.admit_fut.set_result(None)
        loop = asyncio.get_running_loop()
        item.timer = loop.call_later(item.duration, self.finish, item, DONE, config)

    def finish(self, item: Item, state: int, config: SimConfig) -> None:
        """End an item (DONE or ABORTED), free its KV, admit waiters, wake its handler."""
        if item.state not in (QUEUED, RUNNING):
            return
        rank = self.rank(item.rank)
        if item.state == RUNNING:
            rank.used -= item.reserve
            rank.running -= 1
            if item.timer is not None:
                item.timer.cancel()
        else:
            rank.queue.remove(item)
        item.state = state
        del self.live[item]
        self.rid_counts[item.rid] -= 1
        if self.rid_counts[item.rid] <= 0:
            del self.rid_counts[item.rid]
        if state == DONE:
            self._count_done(item)
        else:
            self.stats.aborted_items += 1
        for fut in (item.fut, item.admit_fut):
            if fut is not None and not fut.done():
                fut.set_result(None)
        self.drain(rank, config)

    def drain(self, rank: Rank, config: SimConfig) -> None:
        now = asyncio.get_running_loop().time()
        while rank.queue and self._fits(rank, rank.queue[0], config):
            self._admit(rank, rank.queue.popleft(), config, now)

    def _count_done(self, item: Item) -> None:
        stats = self.stats
        stats.generated_tokens += len(item.output_ids)
        stats.by_kv_dtype[item.kv_dtype] += 1
        if len(stats.rid_kv_dtype) < RID_LIMIT:
            stats.rid_kv_dtype[item.rid] = item.kv_dtype
        now = asyncio.get_running_loop().time()
        start, tokens = self._window
        if now - start >= 2.0:
            self._last_throughput = tokens / (now - start)
            start, tokens = now, 0
        self._window = (start, tokens + len(item.output_ids))

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last window of about two seconds."""
        start, tokens = self._window
        elapsed = asyncio.get_running_loop().time() - start
        return tokens / elapsed if elapsed > 4.0 else self._last_throughput

    def abort(self, rid: str, abort_all: bool, config: SimConfig) -> int:
        """``/abort_request``: a no-op unless ``rid`` is in flight; then every rid starting
        with it ends with a 200 + abort answer keeping its partial output."""
        if abort_all:
            targets = list(self.live)
        elif rid in self.rid_counts:
            targets = [item for item in self.live if item.rid.startswith(rid)]
        else:
            return 0
        now = asyncio.get_running_loop().time()
        for item in targets:
            if item.state == RUNNING:
                done = (now - item.admitted_at) / item.duration if item.duration > 0 else 0.0
                item.keep = max(0, min(len(item.output_ids) - 1, int(len(item.output_ids) * done)))
                message = f"Abort request {item.rid}"
                item.abort_finish = abort_reason(message, None, None)
            else:
                item.abort_finish = {"type": "abort", "message": "Abort in waiting queue"}
            self.finish(item, ABORTED, config)
        return len(targets)

    def drop(self, items: Iterable[Item], config: SimConfig) -> None:
        """Free items whose answer will never be read (client gone, connection dropped)."""
        for item in items:
            self.finish(item, ABORTED, config)

    def load(self, config: SimConfig) -> list[dict[str, Any]]:
        ranks = [self.rank(i) for i in range(config.dp_size)]
        return [
            {
                "dp_rank": r.index,
                "num_reqs": r.running + len(r.queue),
                "num_waiting_reqs": len(r.queue),
                "num_tokens": r.used,
            }
            for r in ranks
        ]


def abort_reason(message: str, status: int | None, err_type: str | None) -> FinishReason:
    return {"type": "abort", "message": message, "status_code": status, "err_type": err_type}
