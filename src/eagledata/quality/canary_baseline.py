"""The canary's stored reference: the fixed inputs and what a trusted server computed on them.

The baseline is recorded once, at the start (several scorings, idle and under load), and stored in
the run directory (``canary/baseline.json``) so that ``resume`` compares with the original; the
null distribution of its runs is stored with it. The requests that produce it are in
``canary_scorer``, the checks that compare with it in ``canary``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from eagledata.atomic import atomic_write
from eagledata.config import CanarySettings
from eagledata.errors import ConfigError
from eagledata.quality.canary_stats import (
    Rules,
    Scoring,
    median_reference,
    null_statistics,
    thresholds,
)

BASELINE_VERSION = 1


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
    sampled_lps: np.ndarray | None = None
    """The logprob the server gave each reference token as it sampled it, references
    concatenated (None: it returned none); the first point of the baseline's self-check."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "references": [{"prompt": p, "reference": r} for p, r in self.references],
            "probes": self.probes,
            "top_k": self.top_k,
            "probe_tokens": self.probe_tokens,
        }
        if self.sampled_lps is not None:
            out["sampled_lps"] = self.sampled_lps.astype(np.float32)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CanarySet:
        sampled = raw.get("sampled_lps")
        return cls(
            [(list(e["prompt"]), list(e["reference"])) for e in raw["references"]],
            [list(p) for p in raw["probes"]],
            int(raw["top_k"]),
            int(raw["probe_tokens"]),
            None if sampled is None else np.asarray(sampled, dtype=np.float64),
        )

    @property
    def scored_tokens(self) -> int:
        return sum(len(ref) for _, ref in self.references)


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
        atomic_write(path, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))

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
            tokens = (baseline.canary_set.scored_tokens,)
            if any(run.lps.shape != tokens for run in runs):
                raise ValueError("runs do not cover the references")
            sampled = baseline.canary_set.sampled_lps
            if sampled is not None and sampled.shape != tokens:
                raise ValueError("sampled_lps do not cover the references")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"canary baseline {path} is not a valid baseline ({exc}); {fix}"
            ) from None
        return baseline
