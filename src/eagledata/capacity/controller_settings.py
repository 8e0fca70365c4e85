"""The settings of ``--concurrency auto``'s arithmetic, shared by the gate
(``capacity/controller.py``) and the usage target it moves (``capacity/usage_target.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    target_usage: float = 0.85
    min_usage: float = 0.60
    max_usage: float = 0.95
    backoff: float = 0.05
    creep: float = 0.01
    freeze_s: float = 120.0
    creep_every_s: float = 30.0
    pause_usage: float = 0.97
    calm_usage: float = 0.95
    """A period whose measured peak stayed under this may raise the target."""
    near_miss_usage: float = 0.985
    """A measured peak this high lowers the target, before a retraction does."""
    length_quantile: float = 0.9
    min_samples: int = 8
    chunked_prefill_size: int = 8192
    default_decode_rate: float = 10.0
    """Tokens per second per request before the server or a result says otherwise (the
    reference run decoded ~10-12 tok/s per sequence)."""
    backoff_gap_s: float = 2.0
    """Signals of one retraction arrive through several channels: one backoff per gap."""
    overflow_quantile: float = 0.9
    """The share of sampled futures whose KV peak must stay within the target share."""
    ceiling_hold_s: float = 600.0
    """How long a retraction's ceiling holds the creep below it, per step it lifts."""
