"""Capacity planner: KV tokens, concurrency, throughput and wall clock per launch profile.

The arithmetic is SGLang's own pool sizing (``kimi-k25-capacity.md`` sections 3 and 5)::

    cell_bytes       = (kv_lora_rank + qk_rope_head_dim) * layers * dtype_bytes        # MLA
                     = kv_heads_per_rank * (head_dim + v_head_dim) * layers * dtype_bytes  # MHA
    kv_gib_per_rank  = post_free - dpa_extra[dp] - pre_free * (1 - mem_fraction) - mm_reservation
    tokens_per_rank  = floor(kv_gib_per_rank * 2**30 / cell_bytes)
    system_tokens    = tokens_per_rank * attention_dp * dcp       # plain TP replicates the cache
    steady_running   = system_tokens / (mean_prompt + mean_output / 2 + slack)
    tok_per_s        = N / (0.077 + 0.00018 * N),  N = min(steady, max_running, 150)  (+-25%)

MLA caches one latent per token on every TP rank, so plain TP does not divide the cache; DP
attention multiplies it by dp (each rank holds its own requests, at the price of replicated
attention weights) and decode context parallelism by dcp (each rank holds 1/dcp of every request).

The fit reproduces both reference runs (bf16 TP8 at 0.85: 116k tokens, 43 running, ~500 tok/s;
fp8 at 0.90: 376k, 139 running, ~1,360 tok/s). It is an empirical two-point fit: above ~150
running requests MoE compute and PCIe communication flatten it, so the planner never evaluates it
beyond ``max_running_fit``, which is also how DCP's 8x capacity turns into a compute cap rather
than 8x speed.

Reference preset (as module constants, and as data in every ``configs/profiles/kimi-k25-*.toml``):
Kimi-K2.5 (MLA 512 + 64, 61 layers: 70,272 B per token in bf16) on 8x RTX PRO 6000 Blackwell
96 GB, ``pre_free`` 94.26 GiB and ``post_free`` 21.73 GiB per GPU, fitted to the two runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from eagledata.errors import ConfigError
from eagledata.profiles import (
    BF16_KV_DTYPES,
    HardwareSection,
    ModelSection,
    Profile,
    ThroughputSection,
)

GIB = 1 << 30

KV_DTYPE_BYTES: dict[str, float] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1,
    "fp4_e2m1": 0.5,  # payload only; SGLang's fp4 pools add scale buffers
    "nvfp4": 0.5,
    "fp4_mx_block16": 0.5,
}

CONCURRENT_REQUEST_TOKENS = 4096
"""The "concurrent 4k requests" column: every running request holding 4,096 tokens."""

MAX_RUNNING_HEADROOM = 1.2
"""Recommended ``--max-running-requests`` = steady state x this, rounded up to a multiple of 8."""

CLIENT_QUEUE_HEADROOM = 1.1
"""Recommended eagledata ``--concurrency`` = running target x this: a few requests wait in the
server queue so a finished slot refills at once, without pushing the KV pool into retraction."""


def kv_dtype_bytes(kv_cache_dtype: str) -> float:
    """Bytes per KV element for a ``--kv-cache-dtype`` value; ``auto`` has no fixed answer."""
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        known = ", ".join(sorted(KV_DTYPE_BYTES))
        raise ConfigError(
            f"kv-cache-dtype: {kv_cache_dtype!r} has no fixed size (known: {known}); "
            "pass bf16 explicitly"
        ) from None


@dataclass(frozen=True)
class KVModel:
    """The per-token KV-cache shape of a model."""

    name: str
    attention: Literal["mla", "mha"]
    num_layers: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, name: str = "") -> KVModel:
        """Read a HF ``config.json`` dict; multimodal wrappers (Kimi-K2.5) nest it in
        ``text_config``."""
        text = config.get("text_config")
        cfg: Mapping[str, Any] = {**config, **text} if isinstance(text, Mapping) else config
        label = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")

        def need(key: str) -> int:
            value = cfg.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config.json: {key}: missing or not an integer ({label})")
            return value

        layers = need("num_hidden_layers")
        if cfg.get("kv_lora_rank") is not None:
            return cls(
                name=label,
                attention="mla",
                num_layers=layers,
                kv_lora_rank=need("kv_lora_rank"),
                qk_rope_head_dim=need("qk_rope_head_dim"),
            )
        heads = need("num_attention_heads")
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or need("hidden_size") // heads
        return cls(
            name=label,
            attention="mha",
            num_layers=layers,
            num_kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            v_head_dim=int(cfg.get("v_head_dim") or head_dim),
        )

    @classmethod
    def from_section(cls, section: ModelSection, *, base_dir: str = "") -> KVModel:
        """The shape a profile's ``[model]`` table describes (or its ``config_json``)."""
        if section.config_json is not None:
            path = Path(base_dir) / section.config_json
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ConfigError(f"model.config_json: cannot read {path}: {error}") from None
            return cls.from_config(config, name=section.name)
        if section.attention == "mla":
            return cls(
                name=section.name,
                attention="mla",
                num_layers=section.num_hidden_layers or 0,
                kv_lora_rank=section.kv_lora_rank or 0,
                qk_rope_head_dim=section.qk_rope_head_dim or 0,
            )
        head_dim = section.head_dim or 0
        return cls(
            name=section.name,
            attention="mha",
            num_layers=section.num_hidden_layers or 0,
            num_kv_heads=section.num_key_value_heads or 0,
            head_dim=head_dim,
            v_head_dim=section.v_head_dim or head_dim,
        )

    def cell_bytes(self, kv_cache_dtype: str, *, attn_tp_size: int = 1) -> int:
        """Bytes one token occupies in one rank's KV pool (SGLang ``_compute_cell_size``).

        The MLA latent is never split across ranks; MHA keeps ``kv_heads / attn_tp`` heads.
        """
        dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
        if self.attention == "mla":
            elements = (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers
        else:
            heads = max(1, self.num_kv_heads // max(1, attn_tp_size))
            elements = heads * (self.head_dim + self.v_head_dim) * self.num_layers
        return math.ceil(elements * dtype_bytes)

    @property
    def bf16_bytes_per_token(self) -> int:
        return self.cell_bytes("bf16")


KIMI_K25 = KVModel(
    name="moonshotai/Kimi-K2.5",
    attention="mla",
    num_layers=61,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)
"""Kimi-K2.5 text backbone (DeepSeek-V3 MLA): 70,272 B per token in bf16, on every TP rank."""

KIMI_K25_BF16_BYTES_PER_TOKEN = 70_272

RTX_PRO_6000_X8_KIMI_K25 = HardwareSection(
    gpu="RTX PRO 6000 Blackwell 96 GB (PCIe Gen5, no NVLink)",
    num_gpus=8,
    pre_free_gib=94.26,
    post_free_gib=21.73,
    mm_reservation_gib=0.0,
    dp_attention_extra_gib={2: 3.1, 4: 5.6, 8: 10.5},
)
"""Per-GPU memory of Kimi-K2.5 INT4 at TP8 on 8x RTX PRO 6000, fitted to the two reference runs
(bf16 @0.85 -> 116,000 tokens; fp8 @0.90 -> 376,029): free before weights 94.26 GiB, after
21.73 GiB. DP attention replicates attention + embedding weights: +3.1/5.6/10.5 GiB at dp 2/4/8
(arithmetic, unmeasured)."""


@dataclass(frozen=True)
class Deployment:
    """The server settings the planner needs, as read from a profile's ``[sglang_args]``."""

    kv_cache_dtype: str
    mem_fraction_static: float
    tp_size: int = 1
    attn_dp_size: int = 1
    dcp_size: int = 1
    max_running_requests: int | None = None
    context_length: int | None = None
    cuda_graph_max_bs: int | None = None

    @classmethod
    def from_profile(cls, profile: Profile) -> Deployment:
        return cls(
            kv_cache_dtype=profile.kv_cache_dtype,
            mem_fraction_static=profile.mem_fraction_static,
            tp_size=profile.tp_size,
            attn_dp_size=profile.dp_size if profile.enable_dp_attention else 1,
            dcp_size=profile.dcp_size,
            max_running_requests=profile.max_running_requests,
            context_length=profile.context_length,
            cuda_graph_max_bs=profile.cuda_graph_max_bs,
        )

    @property
    def attn_tp_size(self) -> int:
        return max(1, self.tp_size // self.attn_dp_size)

    @property
    def parallelism(self) -> str:
        text = f"TP{self.tp_size}"
        if self.attn_dp_size > 1:
            text += f" DPA{self.attn_dp_size}"
        if self.dcp_size > 1:
            text += f" DCP{self.dcp_size}"
        return text


def kv_gib_per_rank(hardware: HardwareSection, deployment: Deployment) -> float:
    """GiB of KV pool one rank gets (may be <= 0: SGLang then refuses to start)."""
    post = hardware.post_free_gib
    if deployment.attn_dp_size > 1:
        try:
            post -= hardware.dp_attention_extra_gib[deployment.attn_dp_size]
        except KeyError:
            raise ConfigError(
                f"hardware.dp_attention_extra_gib: no entry for dp {deployment.attn_dp_size}"
            ) from None
    headroom = hardware.pre_free_gib * (1.0 - deployment.mem_fraction_static)
    return post - headroom - hardware.mm_reservation_gib


def kv_tokens_per_rank(hardware: HardwareSection, deployment: Deployment, cell_bytes: int) -> int:
    """``max_total_num_tokens`` of one rank, as SGLang computes it."""
    gib = kv_gib_per_rank(hardware, deployment)
    return max(0, math.floor(gib * GIB / cell_bytes))


def decode_tok_s(running: float, throughput: ThroughputSection) -> float:
    """Generated tok/s with ``running`` requests decoding (the two-run step-time fit)."""
    if running <= 0:
        return 0.0
    return running / (throughput.step_base_s + throughput.step_per_request_s * running)


class Workload(BaseModel):
    """What a generation job asks of the server.

    Build it from a sample of templated prompt lengths with :meth:`from_prompt_lengths`.
    ``mean_output_tokens`` is the expected answer length (for thinking models often far below
    ``max_new_tokens``); when unknown it is taken as ``max_new_tokens`` (a pessimistic plan).
    ``slack_tokens`` covers admission reservations and uneven progress: with the default 150 a
    300-token prompt and a 4,500-token answer hold 2,700 tokens per running request, what both
    reference runs showed (116k/42.5 and 376k/142).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_prompts: Annotated[int, Field(gt=0)]
    samples_per_prompt: Annotated[int, Field(gt=0)] = 1
    mean_prompt_tokens: Annotated[float, Field(ge=0)]
    p90_prompt_tokens: Annotated[float, Field(ge=0)] | None = None
    max_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    max_new_tokens: Annotated[int, Field(gt=0)]
    mean_output_tokens: Annotated[float, Field(gt=0)]
    mean_output_assumed: bool = False
    slack_tokens: Annotated[int, Field(ge=0)] = 150
    prompt_length_sample: tuple[int, ...] = Field(default=(), repr=False)

    @classmethod
    def from_prompt_lengths(
        cls,
        prompt_lengths: Sequence[int],
        *,
        max_new_tokens: int,
        mean_output_tokens: float | None = None,
        num_prompts: int | None = None,
        samples_per_prompt: int = 1,
        slack_tokens: int = 150,
    ) -> Workload:
        """A workload from a sample of prompt token lengths (``num_prompts`` defaults to its
        size)."""
        lengths = sorted(int(n) for n in prompt_lengths)
        if not lengths:
            raise ConfigError("workload: the prompt length sample is empty")
        p90 = lengths[max(0, math.ceil(0.9 * len(lengths)) - 1)]
        return cls(
            num_prompts=num_prompts if num_prompts is not None else len(lengths),
            samples_per_prompt=samples_per_prompt,
            mean_prompt_tokens=sum(lengths) / len(lengths),
            p90_prompt_tokens=p90,
            max_prompt_tokens=lengths[-1],
            max_new_tokens=max_new_tokens,
            mean_output_tokens=(
                mean_output_tokens if mean_output_tokens is not None else max_new_tokens
            ),
            mean_output_assumed=mean_output_tokens is None,
            slack_tokens=slack_tokens,
            prompt_length_sample=tuple(lengths),
        )

    @property
    def tokens_per_running_request(self) -> float:
        """Average KV tokens a running request holds: its prompt plus half its answer."""
        return self.mean_prompt_tokens + 0.5 * self.mean_output_tokens + self.slack_tokens

    @property
    def total_output_tokens(self) -> float:
        return self.num_prompts * self.samples_per_prompt * self.mean_output_tokens

    def fraction_over(self, context_length: int) -> float | None:
        """Share of sampled prompts that cannot get ``max_new_tokens`` within the context."""
        if not self.prompt_length_sample:
            return None
        limit = context_length - self.max_new_tokens
        over = sum(1 for n in self.prompt_length_sample if n > limit)
        return over / len(self.prompt_length_sample)


REFERENCE_WORKLOAD = Workload(
    num_prompts=88_000,
    mean_prompt_tokens=300,
    max_new_tokens=16_384,
    mean_output_tokens=4_500,
)
"""The reference job: ~88,000 prompts, ~4,500-token answers (396M output tokens). The 300-token
mean prompt is an assumption that, with the default slack, matches the 2,700 tokens per running
request both reference runs showed."""


class PlanRow(BaseModel):
    """One profile's plan. Token counts are KV slots; rates are generated tok/s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str
    kv_cache_dtype: str
    plan_only: bool
    status: str
    parallelism: str
    mem_fraction_static: float
    cell_bytes: int
    kv_gib_per_rank: float
    tokens_per_rank: int
    system_tokens: int
    starts: bool
    concurrent_4k: int
    steady_concurrency: int
    running: int
    recommended_max_running_requests: int
    recommended_concurrency: int
    profile_max_running_requests: int | None
    tok_s: float
    tok_s_low: float
    tok_s_high: float
    wall_clock_hours: float | None
    wall_clock_hours_low: float | None
    wall_clock_hours_high: float | None
    notes: list[str]
    """What the arithmetic found (pool fails, compute cap, context too short, ...)."""
    profile_notes: list[str] = []
    """The profile's own ``notes`` (what is measured, what is not)."""

    @property
    def is_bf16(self) -> bool:
        return self.kv_cache_dtype in BF16_KV_DTYPES


def _round_up(value: float, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def plan_deployment(
    *,
    label: str,
    model: KVModel,
    hardware: HardwareSection,
    deployment: Deployment,
    workload: Workload,
    throughput: ThroughputSection | None = None,
    plan_only: bool = False,
    status: str = "",
    profile_notes: Sequence[str] = (),
) -> PlanRow:
    """The plan for one deployment; pure arithmetic, no I/O."""
    fit = throughput or ThroughputSection()
    notes: list[str] = []
    cell = model.cell_bytes(deployment.kv_cache_dtype, attn_tp_size=deployment.attn_tp_size)
    gib = kv_gib_per_rank(hardware, deployment)
    per_rank = kv_tokens_per_rank(hardware, deployment, cell)
    system = per_rank * deployment.attn_dp_size * deployment.dcp_size
    starts = per_rank > 0
    if not starts:
        notes.append(
            f"KV pool {gib:.2f} GiB per rank: SGLang aborts with 'Not enough memory'; "
            "raise --mem-fraction-static or drop DP attention"
        )

    steady = math.floor(system / workload.tokens_per_running_request)
    rec_mrr = min(_round_up(steady * MAX_RUNNING_HEADROOM, 8), fit.max_running_cap)
    rec_concurrency = math.ceil(min(steady, rec_mrr) * CLIENT_QUEUE_HEADROOM) if starts else 0

    server_cap = deployment.max_running_requests
    running = steady if server_cap is None else min(steady, server_cap)
    if server_cap is not None and server_cap < min(steady, rec_mrr):
        notes.append(
            f"--max-running-requests {server_cap} holds the batch below the KV's steady state "
            f"({steady})"
        )
    fit_running = min(running, fit.max_running_fit)
    if running > fit.max_running_fit:
        notes.append(
            f"KV holds {steady} running requests; decode is compute-bound above "
            f"~{fit.max_running_fit}, so tok/s is rated there"
        )

    tok_s = decode_tok_s(fit_running, fit)
    low, high = tok_s * (1 - fit.band), tok_s * (1 + fit.band)

    graph_bs = deployment.cuda_graph_max_bs
    per_rank_batch = math.ceil(min(running, rec_mrr) / deployment.attn_dp_size)
    if graph_bs is not None and starts and graph_bs < per_rank_batch:
        notes.append(
            f"--cuda-graph-max-bs {graph_bs} < {per_rank_batch} running per rank: larger decode "
            "batches run without CUDA graphs"
        )
    if deployment.context_length is not None:
        over = workload.fraction_over(deployment.context_length)
        if over:
            notes.append(
                f"{over:.1%} of sampled prompts leave less than max_new_tokens "
                f"{workload.max_new_tokens} within --context-length {deployment.context_length}"
            )
        elif (
            over is None
            and workload.max_prompt_tokens is not None
            and workload.max_prompt_tokens + workload.max_new_tokens > deployment.context_length
        ):
            notes.append("longest prompt + max_new_tokens exceeds --context-length")
    if workload.mean_output_assumed:
        notes.append("mean output assumed = max_new_tokens (pass the expected mean output)")

    def hours(rate: float) -> float | None:
        return workload.total_output_tokens / rate / 3600 if rate > 0 else None

    return PlanRow(
        profile=label,
        kv_cache_dtype=deployment.kv_cache_dtype,
        plan_only=plan_only,
        status=status,
        parallelism=deployment.parallelism,
        mem_fraction_static=deployment.mem_fraction_static,
        cell_bytes=cell,
        kv_gib_per_rank=gib,
        tokens_per_rank=per_rank,
        system_tokens=system,
        starts=starts,
        concurrent_4k=system // CONCURRENT_REQUEST_TOKENS,
        steady_concurrency=steady,
        running=running,
        recommended_max_running_requests=rec_mrr if starts else 0,
        recommended_concurrency=rec_concurrency,
        profile_max_running_requests=server_cap,
        tok_s=tok_s,
        tok_s_low=low,
        tok_s_high=high,
        wall_clock_hours=hours(tok_s),
        wall_clock_hours_low=hours(high),
        wall_clock_hours_high=hours(low),
        notes=notes,
        profile_notes=list(profile_notes),
    )


def plan_profile(profile: Profile, workload: Workload) -> PlanRow:
    """The plan for one launch profile."""
    base_dir = str(Path(profile.source).parent) if profile.source else ""
    return plan_deployment(
        label=profile.name,
        model=KVModel.from_section(profile.model, base_dir=base_dir),
        hardware=profile.hardware,
        deployment=Deployment.from_profile(profile),
        workload=workload,
        throughput=profile.throughput,
        plan_only=profile.plan_only,
        status=profile.status,
        profile_notes=profile.notes,
    )


def plan_profiles(profiles: Sequence[Profile], workload: Workload) -> list[PlanRow]:
    """One :class:`PlanRow` per profile, in the given order."""
    return [plan_profile(profile, workload) for profile in profiles]


# --- rendering -----------------------------------------------------------------------------


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}k"
    return str(n)


def _days(hours: float | None) -> str:
    return "-" if hours is None else f"{hours / 24:.1f}"


def _common_prefix(names: Sequence[str]) -> str:
    if len(names) < 2:
        return ""
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    cut = prefix.rfind("-")
    return prefix[: cut + 1] if cut >= 0 else ""


def _row_cells(row: PlanRow) -> list[str]:
    dtype = row.kv_cache_dtype
    if not row.is_bf16:
        dtype = f"{dtype} REJECTED" if len(dtype) <= 6 else f"{dtype.split('_')[0]} REJECTED"
    if not row.starts:
        dash = "-"
        return [
            dtype,
            row.parallelism,
            f"{row.mem_fraction_static:.2f}",
            f"{row.kv_gib_per_rank:.2f}",
            "0 (fails)",
            "0 (fails)",
            *[dash] * 7,
        ]
    mrr = str(row.recommended_max_running_requests)
    if row.profile_max_running_requests is not None:
        mrr += f" ({row.profile_max_running_requests})"
    return [
        dtype,
        row.parallelism,
        f"{row.mem_fraction_static:.2f}",
        f"{row.kv_gib_per_rank:.2f}",
        _tokens(row.tokens_per_rank),
        _tokens(row.system_tokens),
        str(row.concurrent_4k),
        str(row.steady_concurrency),
        mrr,
        str(row.recommended_concurrency),
        f"{row.tok_s:,.0f}",
        f"{row.tok_s_low:,.0f}-{row.tok_s_high:,.0f}",
        f"{_days(row.wall_clock_hours)} ({_days(row.wall_clock_hours_low)}-"
        f"{_days(row.wall_clock_hours_high)})",
    ]


_ROW_LABELS = [
    "KV cache dtype",
    "parallelism",
    "--mem-fraction-static",
    "KV GiB per rank",
    "KV tokens per rank",
    "KV tokens, system",
    "concurrent 4k requests",
    "steady-state running",
    "--max-running-requests",
    "eagledata --concurrency",
    "gen tok/s",
    "gen tok/s band",
    "wall clock, days",
]


def render_plan_table(
    rows: Sequence[PlanRow], *, workload: Workload | None = None, width: int = 100
) -> str:
    """Profiles side by side (one column each, wrapped to ``width``), then status and notes
    per profile, then which bf16 profile is fastest and how it compares with a rejected row.

    Rejected (non-bf16, plan-only) columns come last. ``--max-running-requests`` shows the
    recommendation with the profile's own value in brackets.
    """
    if not rows:
        return "no profiles to plan"
    ordered = [r for r in rows if r.is_bf16] + [r for r in rows if not r.is_bf16]
    prefix = _common_prefix([row.profile for row in ordered])
    headers = [row.profile[len(prefix) :] or row.profile for row in ordered]
    columns = [[header, *_row_cells(row)] for header, row in zip(headers, ordered, strict=True)]
    label_width = max(len(label) for label in _ROW_LABELS)
    col_widths = [max(len(cell) for cell in column) for column in columns]

    lines: list[str] = []
    if workload is not None:
        samples = workload.samples_per_prompt
        lines.append(
            f"workload: {workload.num_prompts:,} prompts"
            + (f" x {samples} samples" if samples > 1 else "")
            + f", mean prompt {workload.mean_prompt_tokens:,.0f}, mean output "
            f"{workload.mean_output_tokens:,.0f}: {workload.total_output_tokens / 1e6:,.1f}M "
            "output tokens"
        )
        lines.append(
            f"  {workload.tokens_per_running_request:,.0f} KV tokens per running request; "
            "wall clock = output tokens / gen tok/s (prefill not counted)"
        )
    if prefix:
        lines.append(f"profiles {prefix}*")
    start = 0
    while start < len(columns):
        used = label_width
        end = start
        while end < len(columns) and (end == start or used + 2 + col_widths[end] <= width):
            used += 2 + col_widths[end]
            end += 1
        if start:
            lines.append("")
        chunk = range(start, end)
        head = " " * label_width + "".join("  " + columns[i][0].ljust(col_widths[i]) for i in chunk)
        lines.append(head.rstrip())
        for r, label in enumerate(_ROW_LABELS, start=1):
            cells = "".join("  " + columns[i][r].ljust(col_widths[i]) for i in chunk)
            lines.append((label.ljust(label_width) + cells).rstrip())
        start = end

    for header, row in zip(headers, ordered, strict=True):
        lines.append("")
        status = row.status or "no status"
        if not row.is_bf16:
            status += f" (kv-cache-dtype {row.kv_cache_dtype}, plan only)"
        lines.append(f"{header}: {status}")
        lines += [f"  - {note}" for note in [*row.notes, *row.profile_notes]]

    lines.append("")
    lines.append(_verdict(ordered, headers))
    return "\n".join(lines)


def _verdict(rows: Sequence[PlanRow], headers: Sequence[str]) -> str:
    named = list(zip(headers, rows, strict=True))
    bf16 = [(h, r) for h, r in named if r.is_bf16 and r.starts]
    rejected = [(h, r) for h, r in named if not r.is_bf16 and r.starts]
    if not bf16:
        return "no bf16 profile starts: nothing here may generate data"
    best_name, best = max(bf16, key=lambda item: item[1].tok_s)
    text = f"best bf16 profile: {best_name}, ~{best.tok_s:,.0f} tok/s"
    if best.wall_clock_hours is not None:
        text += f" ({best.wall_clock_hours / 24:.1f} days)"
    if rejected:
        ref_name, ref = max(rejected, key=lambda item: item[1].tok_s)
        beating = [h for h, r in bf16 if r.tok_s >= ref.tok_s]
        text += f"\nrejected {ref_name} ({ref.kv_cache_dtype} KV): ~{ref.tok_s:,.0f} tok/s; " + (
            f"bf16 at or above it: {', '.join(beating)}" if beating else "no bf16 profile"
        )
    return text
