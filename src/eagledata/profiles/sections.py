"""The tables of a launch profile beside its flags: ``[server]`` (where it listens), ``[model]``
(the model's KV cell and what one GPU holds once it loads), ``[throughput]`` (the step-time fit),
``[draft]`` (a speculative profile's draft model); and ``HardwareSection``, the per-GPU memory
facts the planner makes from a rig and ``[model]``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FrozenStrict(BaseModel):
    """A table of a profile: unknown keys refused, frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSection(FrozenStrict):
    """Where the server listens, and where eagledata reaches it."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 30000

    @property
    def base_url(self) -> str:
        """The URL to poll: a wildcard bind address is reached on loopback."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


class ModelSection(FrozenStrict):
    """The KV-cache shape of the served model (fields of its ``config.json``).

    ``config_json`` (relative to the profile file) may replace the shape fields; for Kimi-K2.5
    the shape lives under ``text_config`` there, which the planner handles.
    """

    name: str
    attention: Literal["mla", "mha"] = "mla"
    num_hidden_layers: Annotated[int, Field(gt=0)] | None = None
    kv_lora_rank: Annotated[int, Field(gt=0)] | None = None
    qk_rope_head_dim: Annotated[int, Field(ge=0)] | None = None
    num_key_value_heads: Annotated[int, Field(gt=0)] | None = None
    head_dim: Annotated[int, Field(gt=0)] | None = None
    v_head_dim: Annotated[int, Field(gt=0)] | None = None
    config_json: str | None = None
    # what one GPU holds once the model has loaded (the planner's memory facts)
    resident_gib: Annotated[float, Field(gt=0)]
    """GiB one GPU holds after the weights load at TP ``resident_tp`` (weights, runtime buffers;
    Kimi-K2.5 at TP8: 72.53, fitted to the reference runs)."""
    resident_tp: Annotated[int, Field(gt=0)] = 8
    replicated_gib: Annotated[float, Field(ge=0)] = 0.0
    """Of ``resident_gib``, what every GPU holds whatever the TP size (replicated weights,
    runtime buffers); the rest is split over the TP ranks."""
    dp_attention_extra_gib: dict[int, Annotated[float, Field(ge=0)]] = {}
    """Extra replicated attention and embedding weights per GPU under DP attention, by dp."""
    mm_reservation_gib: Annotated[float, Field(ge=0)] = 0.0
    """SGLang's VLM reservation when ``resident_gib`` was read from a log directly (a fitted
    value already absorbs it)."""

    @model_validator(mode="after")
    def _resident_covers_replicated(self) -> ModelSection:
        if self.replicated_gib > self.resident_gib:
            raise ValueError("replicated_gib cannot exceed resident_gib")
        return self

    def resident_gib_at(self, tp_size: int) -> float:
        """GiB one GPU holds after loading at ``tp_size``: the replicated part, plus the split
        part divided over ``tp_size`` ranks instead of ``resident_tp``."""
        split = (self.resident_gib - self.replicated_gib) * self.resident_tp / tp_size
        return round(self.replicated_gib + split, 4)

    @model_validator(mode="after")
    def _shape_is_known(self) -> ModelSection:
        if self.config_json is not None:
            return self
        needed = (
            ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim")
            if self.attention == "mla"
            else ("num_hidden_layers", "num_key_value_heads", "head_dim")
        )
        missing = [key for key in needed if getattr(self, key) is None]
        if missing:
            raise ValueError(f"{self.attention} needs {', '.join(missing)} (or config_json)")
        return self


class HardwareSection(FrozenStrict):
    """Per-GPU memory facts of one deployment, as SGLang's pool sizing sees them (GiB): the
    planner's input, made from a rig and a profile's ``[model]`` (``capacity/placement.py``).

    ``post_free_gib`` is the free memory after the weights load; the fitted reference value
    already absorbs SGLang's small VLM reservation, so ``mm_reservation_gib`` is 0 unless
    ``post_free_gib`` was read from a log directly.
    """

    gpu: str
    num_gpus: Annotated[int, Field(gt=0)]
    pre_free_gib: Annotated[float, Field(gt=0)]
    post_free_gib: float
    mm_reservation_gib: Annotated[float, Field(ge=0)] = 0.0
    dp_attention_extra_gib: dict[int, Annotated[float, Field(ge=0)]] = {}


class ThroughputSection(FrozenStrict):
    """Decode step-time fit ``tok/s = N / (step_base_s + step_per_request_s * N)``."""

    step_base_s: Annotated[float, Field(gt=0)] = 0.077
    step_per_request_s: Annotated[float, Field(ge=0)] = 0.00018
    band: Annotated[float, Field(ge=0, lt=1)] = 0.25
    max_running_fit: Annotated[int, Field(gt=0)] = 150
    """The fit holds to about this many running requests; above it compute flattens the curve."""
    max_running_cap: Annotated[int, Field(gt=0)] = 256
    """Never recommend more running requests than this (compute-bound, not KV-bound)."""
    step_speed: Annotated[float, Field(gt=0)] = 1.0
    """How fast this profile's steps run against the fitted ones: 1, as fitted; below 1, the
    measurement a row cites for a layout the fit never ran (DCP 8: vLLM's on the reference rig
    ran at 0.65-0.82x of DCP 1, so 0.735, its middle). The row is rated at it."""
    step_speed_hope: Annotated[float, Field(gt=0)] | None = None
    """The measurement's favourable end (DCP 8: 0.82): the row names its rate there too."""

    def at_step_speed(self) -> ThroughputSection:
        """The fit with ``step_speed`` in its step times (and 1 left: applied once)."""
        if self.step_speed == 1.0:
            return self
        return self.model_copy(
            update={
                "step_base_s": self.step_base_s / self.step_speed,
                "step_per_request_s": self.step_per_request_s / self.step_speed,
                "step_speed": 1.0,
                "step_speed_hope": None,
            }
        )


class DraftSection(FrozenStrict):
    """A speculative profile's draft model: what the planner needs beyond the flags.

    The draft's weights, KV pool and CUDA graphs load after the target has sized its KV pool, so
    they come out of the ``(1 - mem_fraction_static)`` headroom (SGLang's own default fraction
    reserves 2 GiB more for "eagle draft models and cuda graphs", ``server_args.py``).
    """

    name: str
    """Must equal ``sglang_args.speculative-draft-model-path``."""
    accept_length: Annotated[float, Field(gt=1)]
    """Tokens per verify step (accepted drafts + the target's own token), SGLang's definition."""
    accept_length_source: str
    weights_gib_per_gpu: Annotated[float, Field(ge=0)]
    kv_bytes_per_token: Annotated[int, Field(ge=0)]
    """Draft KV per token on one rank (bf16); its pool has as many tokens as the target's."""
    graph_gib: Annotated[float, Field(ge=0)] = 1.0
    draft_step_s: Annotated[float, Field(gt=0)] = 0.0015
    """One draft forward: about one target layer's share of the step floor (0.077 s / 61)."""
    draft_step_per_request_s: Annotated[float, Field(ge=0)] = 0.000003
