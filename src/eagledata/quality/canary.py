"""The logprob canary: does the server still compute what it computed when the run began?

A dtype flag is what the server says; this is what it does (DESIGN.md, invariant 5). Per check,
for each reference (a prompt of the run's own dataset, chat-templated as production, and a
continuation the server sampled from it once it had passed the KV guard):

1. **warm**: ``{"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}}`` puts the prompt in
   the radix cache;
2. **score**: ``input_ids = prompt + reference``, ``return_logprob``, ``logprob_start_len = P - 1``,
   ``top_logprobs_num``, ``max_new_tokens: 0``: the logprob of every reference token, and the
   top-k at each position. ``cached_tokens`` must show the prompt came from the cache: on SGLang's
   MLA backends a cold prefill scores the new tokens from in-flight bf16 values and never reads
   the pooled KV, so a cold canary is blind to an fp8 or corrupted cache (``tests/test_canary.py``
   shows it). A returned token id that is not the reference's is a token-fidelity failure: a hard
   stop, not drift.

Plus greedy decode probes (the data is produced in decode). The statistics and thresholds are in
``canary_stats``; the baseline (several scorings at the start, idle and under load) is stored in
the run directory (``canary/baseline.json``) so that ``resume`` compares with the original.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from eagledata.config import CanarySettings
from eagledata.errors import CanaryDriftError, ConfigError, ServerError, ServerUnavailableError
from eagledata.quality.canary_stats import (
    Rules,
    Scoring,
    compare,
    fired,
    hard_stop,
    median_reference,
    null_statistics,
    thresholds,
)
from eagledata.server.client import SGLangClient, new_rid

BASELINE_VERSION = 1
PAGE_SLACK = 16
RETRIES = 6
"""A cache hit may stop short of the prompt's end by up to a page (SGLang's ``page_size``)."""


class LineLog(Protocol):
    def append(self, line: bytes) -> None: ...


def rules_of(settings: CanarySettings) -> Rules:
    return Rules.model_validate(
        {name: getattr(settings, name) for name in Rules.model_fields if hasattr(settings, name)}
    )


@dataclass
class CanarySet:
    """The fixed inputs: (prompt, reference continuation) pairs and the greedy probe prompts."""

    references: list[tuple[list[int], list[int]]]
    probes: list[list[int]]
    top_k: int
    probe_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "references": [{"prompt": p, "reference": r} for p, r in self.references],
            "probes": self.probes,
            "top_k": self.top_k,
            "probe_tokens": self.probe_tokens,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CanarySet:
        return cls(
            [(list(e["prompt"]), list(e["reference"])) for e in raw["references"]],
            [list(p) for p in raw["probes"]],
            int(raw["top_k"]),
            int(raw["probe_tokens"]),
        )

    @property
    def scored_tokens(self) -> int:
        return sum(len(ref) for _, ref in self.references)


@dataclass
class Measured:
    """One scoring and what it cost."""

    scoring: Scoring
    requests: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0
    cold: int = 0
    """References scored without their prompt in the cache (blind to the pooled KV)."""
    mismatch: str | None = None


@dataclass
class Baseline:
    """What a trusted server computed: the reference every later check is compared with.

    The null (every pair of runs compared) is computed once, when the baseline is recorded, and
    stored with it; the file keeps each run's token logprobs and greedy outputs, and the top-k
    candidates of the first run only (the one the reference takes its top-k from).
    """

    canary_set: CanarySet
    runs: list[Scoring]
    kinds: list[str]
    rules: Rules
    model_path: str | None
    server: str
    created_at: float = field(default_factory=time.time)
    null: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.null:
            self.null = null_statistics(self.runs)

    @property
    def reference(self) -> Scoring:
        return median_reference(self.runs)

    @property
    def thresholds(self) -> dict[str, float]:
        return thresholds(self.null, self.rules)

    def save(self, path: Path) -> None:
        body = {
            "version": BASELINE_VERSION,
            "model_path": self.model_path,
            "server": self.server,
            "created_at": self.created_at,
            "canary_set": self.canary_set.to_json(),
            "runs": [run.to_json(top=index == 0) for index, run in enumerate(self.runs)],
            "kinds": self.kinds,
            "rules": self.rules.model_dump(),
            "thresholds": self.thresholds,
            "null": self.null,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Baseline:
        fix = (
            "record one with 'eagledata canary --server URL --out FILE', or drop --canary-baseline"
        )
        try:
            raw = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"canary baseline {path} not found; {fix}") from None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"canary baseline {path} is unreadable ({exc}); {fix}") from None
        try:
            if raw.get("version") != BASELINE_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {BASELINE_VERSION}")
            runs = [Scoring.from_json(run) for run in raw["runs"]]
            if len(runs) < 2:
                raise ValueError("fewer than two baseline runs")
            baseline = cls(
                CanarySet.from_json(raw["canary_set"]),
                runs,
                list(raw["kinds"]),
                Rules.model_validate(raw["rules"]),
                raw.get("model_path"),
                str(raw["server"]),
                float(raw["created_at"]),
                [{k: float(v) for k, v in stats.items()} for stats in raw["null"]],
            )
            if any(run.lps.shape != (baseline.canary_set.scored_tokens,) for run in runs):
                raise ValueError("runs do not cover the references")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"canary baseline {path} is not a valid baseline ({exc}); {fix}"
            ) from None
        return baseline


class CanaryScorer:
    """Sends the canary's requests to one named server and parses what comes back."""

    def __init__(self, client: SGLangClient) -> None:
        self.client = client

    async def _post(self, url: str, body: dict[str, Any], counter: Measured) -> dict[str, Any]:
        """One request, tried again on a transient failure (503, 5xx, a reset): a busy server
        is not a drifted one. Past ``RETRIES`` the server is unavailable for this check."""
        for attempt in range(RETRIES):
            counter.requests += 1
            counter.prompt_tokens += len(body["input_ids"])
            try:
                return await self.client.post_generate(url, {**body, "rid": new_rid()})
            except ServerUnavailableError:
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    async def sample_set(
        self,
        url: str,
        prompts: list[list[int]],
        *,
        reference_tokens: int,
        probes: int,
        probe_tokens: int,
        top_k: int,
    ) -> CanarySet:
        """Reference continuations sampled at temperature 1 (the model's own distribution)."""
        counter = Measured(Scoring(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))))
        params = {
            "max_new_tokens": reference_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "ignore_eos": True,
        }

        async def one(prompt: list[int]) -> tuple[list[int], list[int]]:
            answer = await self._post(
                url, {"input_ids": prompt, "sampling_params": params}, counter
            )
            ids = answer.get("output_ids")
            if not isinstance(ids, list) or len(ids) < 2:
                raise ServerError(f"{url}: a canary reference came back without output ids")
            return prompt, [int(t) for t in ids]

        references = list(await asyncio.gather(*(one(p) for p in prompts)))
        return CanarySet(references, [p for p in prompts[:probes]], top_k, probe_tokens)

    async def score(self, url: str, canary: CanarySet, *, warm: bool = True) -> Measured:
        """One canary run: every reference warmed then scored, and the greedy probes. The
        references go concurrently (each one's warm-up before its own scoring): a few seconds of
        prefill on a real server, whatever its latency per request."""
        started = time.monotonic()
        measured = Measured(Scoring(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))))

        async def one(
            prompt: list[int], reference: list[int]
        ) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray, int]:
            if warm:
                await self._post(
                    url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}}, measured
                )
            answer = await self._post(
                url,
                {
                    "input_ids": prompt + reference,
                    "return_logprob": True,
                    "logprob_start_len": len(prompt) - 1,
                    "top_logprobs_num": canary.top_k,
                    "sampling_params": {"max_new_tokens": 0},
                },
                measured,
            )
            return _parse_scored(url, answer, prompt, reference, canary)

        async def probe(prompt: list[int]) -> list[int]:
            params = {"max_new_tokens": canary.probe_tokens, "temperature": 0.0, "ignore_eos": True}
            answer = await self._post(
                url, {"input_ids": prompt, "sampling_params": params}, measured
            )
            return [int(t) for t in answer.get("output_ids") or []]

        scored = await asyncio.gather(*(one(p, r) for p, r in canary.references))
        greedy = list(await asyncio.gather(*(probe(p) for p in canary.probes)))
        for (prompt, reference), (_, ids, _, _, cached) in zip(
            canary.references, scored, strict=True
        ):
            if ids != reference and measured.mismatch is None:
                at = next(i for i, (a, b) in enumerate(zip(ids, reference, strict=True)) if a != b)
                measured.mismatch = (
                    f"token mismatch: scored id {ids[at]} where the reference has {reference[at]} "
                    f"(position {at})"
                )
            if cached < len(prompt) - 1 - PAGE_SLACK:
                measured.cold += 1
        measured.scoring = Scoring(
            np.concatenate([s[0] for s in scored]),
            np.concatenate([s[2] for s in scored]),
            np.concatenate([s[3] for s in scored]),
            greedy,
        )
        measured.seconds = time.monotonic() - started
        return measured

    async def score_under_load(self, url: str, canary: CanarySet, requests: int) -> Measured:
        """A scoring while ``requests`` sampled generations run beside it: batch noise as
        production sees it, without production's results (canary traffic is never data)."""
        stop = asyncio.Event()
        params = {"max_new_tokens": len(canary.references[0][1]), "temperature": 1.0}
        prompts = [p for p, _ in canary.references]

        async def load(index: int) -> None:
            while not stop.is_set():
                prompt = prompts[index % len(prompts)]
                body = {"input_ids": prompt, "sampling_params": params, "rid": new_rid()}
                with contextlib.suppress(ServerError):
                    await self.client.post_generate(url, body)
                index += requests

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(load(i)) for i in range(requests)]
            await asyncio.sleep(0)
            try:
                measured = await self.score(url, canary)
            finally:
                stop.set()
                for task in tasks:
                    task.cancel()
        return measured


def _parse_scored(
    url: str, answer: dict[str, Any], prompt: list[int], reference: list[int], canary: CanarySet
) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray, int]:
    meta = answer.get("meta_info")
    triples = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(triples, list) or not triples:
        raise ServerError(
            f"{url} returned no logprobs (meta_info.input_token_logprobs); the canary needs "
            "SGLang's return_logprob: point --server at the SGLang server itself, or run with "
            "--no-canary"
        )
    if len(triples) != len(reference) + 1 or triples[0][0] is not None:
        raise ServerError(
            f"{url}: the canary asked for {len(reference) + 1} input logprobs from "
            f"logprob_start_len {len(prompt) - 1} and got {len(triples)}; this SGLang version "
            "scores prompts differently: run with --no-canary and report it"
        )
    lp = np.asarray([t[0] for t in triples[1:]], dtype=np.float64)
    ids = [int(t[1]) for t in triples[1:]]
    k = canary.top_k
    top_ids = np.zeros((len(reference), k), dtype=np.int64)
    top_lps = np.full((len(reference), k), -1e9)
    tops = meta.get("input_top_logprobs")
    if k and isinstance(tops, list) and len(tops) == len(triples):
        for row, entries in enumerate(tops[1:]):
            for col, entry in enumerate((entries or [])[:k]):
                top_lps[row, col], top_ids[row, col] = float(entry[0]), int(entry[1])
    cached = meta.get("cached_tokens")
    return lp, ids, top_ids, top_lps, int(cached) if isinstance(cached, int) else 0


async def build_baseline(
    scorer: CanaryScorer,
    url: str,
    prompts: list[list[int]],
    settings: CanarySettings,
    *,
    model_path: str | None,
    ledger: LineLog | None,
) -> Baseline:
    """Sample the references on a trusted server, then score them idle and under load."""
    canary = await scorer.sample_set(
        url,
        prompts,
        reference_tokens=settings.reference_tokens,
        probes=settings.probes,
        probe_tokens=settings.probe_tokens,
        top_k=settings.top_logprobs,
    )
    runs: list[Measured] = []
    kinds: list[str] = []
    for _ in range(settings.baseline_idle_runs):
        runs.append(await scorer.score(url, canary))
        kinds.append("idle")
    for _ in range(settings.baseline_load_runs):
        runs.append(await scorer.score_under_load(url, canary, settings.load_requests))
        kinds.append("load")
    if len(runs) < 2:  # one run has no noise to measure: score it once more
        runs.append(await scorer.score(url, canary))
        kinds.append("idle")
    for measured in runs:
        if measured.mismatch:
            raise ServerError(
                f"{url}: the canary's baseline does not reproduce its own references "
                f"({measured.mismatch}); the server is not token-faithful"
            )
    baseline = Baseline(
        canary, [m.scoring for m in runs], kinds, rules_of(settings), model_path, url
    )
    if ledger is not None:
        limits = baseline.thresholds
        reference = baseline.reference
        for measured, kind in zip(runs, kinds, strict=True):
            _log(
                ledger,
                url,
                "baseline",
                kind,
                "pass",
                compare(measured.scoring, reference),
                limits,
                "",
                measured,
            )
    return baseline


def _log(
    ledger: LineLog,
    url: str,
    kind: str,
    trigger: str,
    verdict: str,
    stats: dict[str, float],
    limits: dict[str, float],
    reason: str,
    measured: Measured | None,
) -> None:
    entry = {
        "time": time.time(),
        "server": url,
        "kind": kind,
        "trigger": trigger,
        "verdict": verdict,
        "stats": stats,
        "thresholds": limits,
        "reason": reason,
        "requests": measured.requests if measured else 0,
        "prompt_tokens": measured.prompt_tokens if measured else 0,
        "seconds": round(measured.seconds, 4) if measured else 0.0,
        "cold": measured.cold if measured else 0,
    }
    ledger.append(orjson.dumps(entry))


class CanaryMonitor:
    """The canary as one of the checks that release held results (run/holding.py).

    ``due`` says when a server needs a check: first contact, every ``period_s``, when its
    ``/server_info`` facts changed, when ``guard_max_held`` of its results wait; reconnects are
    checked by the holder. A check that fires is rerun at once; two fires in a row are drift
    (``CanaryDriftError``, exit 4). A token mismatch, or a change past the hard limits, stops at
    once.
    """

    name = "canary"

    def __init__(
        self,
        scorer: CanaryScorer,
        baseline: Baseline,
        *,
        period_s: float,
        max_held: int,
        ledger: LineLog | None,
        facts_key: Callable[[str], object] | None = None,
    ) -> None:
        self.scorer = scorer
        self.baseline = baseline
        self.period_s = period_s
        self.max_held = max_held
        self.ledger = ledger
        self.facts_key = facts_key
        self._last: dict[str, float] = {}
        self._facts: dict[str, object] = {}
        self._reference = baseline.reference
        self._limits = baseline.thresholds
        self.checks = 0
        self.spent_s = 0.0

    def due(self, url: str, held: int) -> str | None:
        now = time.monotonic()
        if url not in self._last:
            return "start"
        if self.facts_key is not None and self.facts_key(url) != self._facts.get(url):
            return "server_info"
        if held >= self.max_held:
            return "held"
        if now - self._last[url] >= self.period_s:
            return "period"
        return None

    async def check(self, url: str, trigger: str) -> None:
        """Score, compare, log; raise on drift (or ``ServerUnavailableError`` if it cannot)."""
        for attempt in range(2):
            try:
                measured = await self.scorer.score(url, self.baseline.canary_set)
            except ServerUnavailableError as exc:
                if self.ledger is not None:
                    _log(self.ledger, url, "check", trigger, "error", {}, {}, str(exc), None)
                raise
            self.checks += 1
            self.spent_s += measured.seconds
            stats = compare(measured.scoring, self._reference)
            if measured.mismatch:
                self._record(url, trigger, "mismatch", stats, measured.mismatch, measured)
                raise CanaryDriftError(
                    f"{url} failed the canary: {measured.mismatch}; the server is not "
                    "token-faithful; the run is saved: fix the server and run 'eagledata resume "
                    "RUN_DIR'"
                )
            hard = hard_stop(stats, self.baseline.rules)
            fires = hard or fired(stats, self._limits)
            if not fires:
                note = f"{measured.cold} references scored cold" if measured.cold else ""
                self._record(url, trigger, "pass", stats, note, measured)
                self._last[url] = time.monotonic()
                if self.facts_key is not None:
                    self._facts[url] = self.facts_key(url)
                return
            if hard or attempt == 1:
                self._record(url, trigger, "drift", stats, "; ".join(fires), measured)
                raise CanaryDriftError(
                    f"{url} drifted from the canary baseline: {fires[0]}; nothing it produced "
                    "since its last passing canary was kept; the run is saved: fix the server "
                    "and run 'eagledata resume RUN_DIR'"
                )
            self._record(url, trigger, "fired", stats, "; ".join(fires) + " (rerun)", measured)
            trigger = "rerun"

    def _record(
        self,
        url: str,
        trigger: str,
        verdict: str,
        stats: dict[str, float],
        reason: str,
        measured: Measured,
    ) -> None:
        if self.ledger is not None:
            _log(self.ledger, url, "check", trigger, verdict, stats, self._limits, reason, measured)
