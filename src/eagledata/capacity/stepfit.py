"""The reference step-time fit: decode tok/s as a function of running requests."""

from __future__ import annotations

from eagledata.profiles.profile import ThroughputSection


def decode_tok_s(running: float, throughput: ThroughputSection) -> float:
    """Generated tok/s with ``running`` requests decoding (the two-run step-time fit)."""
    if running <= 0:
        return 0.0
    return running / (throughput.step_base_s + throughput.step_per_request_s * running)
