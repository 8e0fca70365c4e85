"""The settings of how a run operates, none of which shapes its data: the servers and how they
are reached, the run's output and concurrency, the load controller, and the logprob canary."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from eagledata.config.validation import Strict


class SimulatedServerSettings(Strict):
    """Start eagledata's own simulated SGLang server on loopback and use it (demo, tests)."""

    enabled: bool = False
    options: dict[str, Any] = Field(default_factory=dict, description="SimConfig fields")


class ServerSettings(Strict):
    urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:30000"], min_length=1)
    api_key_env: str = "SGLANG_API_KEY"
    expected_model: str | None = Field(None, description="Refuse a server serving another model")
    bf16_kv_bytes_per_token: int | None = Field(
        None, ge=1, description="The model's bf16 KV bytes/token (Kimi-K2.5: 70272)"
    )
    kv_heads: int | None = Field(
        None,
        ge=1,
        description="The model's KV heads when attention TP splits its KV cell (MHA/GQA): the "
        "guard divides bf16_kv_bytes_per_token over a server's TP ranks as SGLang does; unset "
        "for MLA, whose latent every rank keeps whole",
    )
    connect_timeout_s: float = Field(10.0, gt=0)
    request_timeout_s: float = Field(
        3600.0, gt=0, description="A request's whole life, connect to last byte (not per read)"
    )
    guard_interval_s: float = Field(60.0, gt=0)
    guard_max_held: int = Field(256, ge=1)
    guard_max_hold_s: float = Field(
        300.0,
        gt=0,
        description="A check of a server is due once one of its results has waited this long: "
        "a crash loses at most this window of answers",
    )
    down_deadline_s: float = Field(1800.0, ge=0)
    max_attempts: int = Field(5, ge=1)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    connections_per_pool: int = Field(8, ge=1, le=1024)
    simulated: SimulatedServerSettings = Field(default_factory=SimulatedServerSettings)

    @field_validator("urls")
    @classmethod
    def _urls_are_http(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                example = f"http://{url}" if "://" not in url else "http://127.0.0.1:30000"
                raise ValueError(f"{url!r} is not an http(s) URL, e.g. {example}")
        return [url.rstrip("/") for url in urls]


class RunSettings(Strict):
    out_dir: Path | None = None
    shard_size: int = Field(1000, ge=1)
    concurrency: int | Literal["auto"] = Field(
        "auto", description="'auto' (sized from the server's load) or a fixed in-flight cap"
    )
    limit: int | None = Field(None, ge=1)
    fsync_interval_s: float = Field(1.0, ge=0)
    progress_log_s: float = Field(
        30.0,
        gt=0,
        description="Off a terminal (a log, CI): a progress line at least this often, whether or "
        "not an item finished",
    )
    watchdog_s: float | None = Field(
        None,
        gt=0,
        description="Seconds without progress (no answer, record or check) before a run writes "
        "a task dump and says where it waits; unset: derived from [server] (run/watchdog.py)",
    )

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: Any) -> Any:
        """'auto' or 1..65536, however it is spelled: ``-5``, ``"-5"`` (a flag, a TOML string)
        and ``8.5`` are refused here, before pydantic's coercion could let them through."""
        if isinstance(value, str) and value.strip() != "auto":
            try:
                value = int(value)
            except ValueError:
                raise ValueError("must be 'auto' or an integer from 1 to 65536") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            return value.strip()
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
            raise ValueError("must be 'auto' or an integer from 1 to 65536")
        return value


class LoadSettings(Strict):
    """``--concurrency auto``: the load controller (``capacity/controller.py``) and telemetry."""

    poll_interval_s: float = Field(1.0, gt=0, description="How often the load is read")
    telemetry_interval_s: float = Field(5.0, gt=0, description="telemetry.jsonl sample period")
    telemetry_max_bytes: int = Field(8 * 1024 * 1024, ge=4096)
    max_in_flight: int = Field(1024, ge=1, le=65536, description="Ceiling under auto")
    target_usage: float = Field(0.85, gt=0, le=1, description="Initial KV usage target u*")
    min_usage: float = Field(0.60, gt=0, le=1)
    max_usage: float = Field(0.95, gt=0, le=1)
    freeze_s: float = Field(120.0, ge=0, description="No increase this long after a retraction")
    creep_every_s: float = Field(30.0, gt=0, description="Period of the +0.01 increases")
    length_quantile: float = Field(0.9, gt=0, le=1, description="Answer-length percentile")
    overflow_quantile: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="Share of the sampled futures of what is in flight whose KV peak must stay "
        "within the target usage",
    )
    expected_output_tokens: int | None = Field(
        None, ge=1, description="Answer-length prior until 8 answers are in (max_new_tokens)"
    )


class CanarySettings(Strict):
    """The logprob canary (quality/canary.py, docs/quality.md). Sizes follow the protocol in
    docs/quality.md; the threshold rules are hypotheses until calibrated."""

    enabled: bool = True
    baseline: Path | None = Field(None, description="A shared baseline file (eagledata canary)")
    prompts: int = Field(24, ge=1, description="Teacher-forced references, from the dataset")
    reference_tokens: int = Field(512, ge=2)
    max_prompt_tokens: int = Field(3000, ge=2)
    probes: int = Field(8, ge=0, description="Greedy decode probes")
    probe_tokens: int = Field(256, ge=1)
    top_logprobs: int = Field(20, ge=0)
    baseline_idle_runs: int = Field(3, ge=1)
    baseline_load_runs: int = Field(3, ge=0)
    load_requests: int = Field(16, ge=1, description="Concurrent requests of the load runs")
    period_s: float = Field(1200.0, gt=0)
    mean_shift_factor: float = Field(4.0, gt=0)
    mean_shift_floor: float = Field(1e-3, ge=0)
    trimmed_abs_factor: float = Field(3.0, gt=0)
    trimmed_abs_margin: float = Field(5e-3, ge=0)
    topk_kl_factor: float = Field(4.0, gt=0)
    topk_kl_floor: float = Field(5e-4, ge=0)
    top1_flip_factor: float = Field(4.0, gt=0)
    top1_flip_floor: float = Field(0.01, ge=0)
    top1_flip_positions: int = Field(
        4, ge=0, description="top1_flip never fires on this many flipped positions or fewer"
    )
    greedy_divergence_factor: float = Field(0.5, gt=0, le=1)
    hard_trimmed_abs: float = Field(0.05, gt=0)
    hard_top1_flip: float = Field(0.05, gt=0)
