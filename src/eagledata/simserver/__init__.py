"""A simulated SGLang server (native ``/generate`` API): deterministic, with a KV capacity model
and fault injection. Used by ``eagledata sim-server``, the demo, the tests and the benchmarks."""

from __future__ import annotations

from eagledata.simserver.app import create_app
from eagledata.simserver.config import SimConfig
from eagledata.simserver.engine import expected_output
from eagledata.simserver.runner import SimServerThread, run_sim_server

__all__ = ["SimConfig", "SimServerThread", "create_app", "expected_output", "run_sim_server"]
