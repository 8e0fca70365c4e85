"""The planner: one :class:`PlanRow` per deployment, from KV sizing, memory and the workload."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagledata.capacity.memory import Deployment, kv_gib_per_rank, kv_tokens_per_rank
from eagledata.capacity.placement import place
from eagledata.capacity.plan_row import EVIDENCE, PlanRow, written_for
from eagledata.capacity.speculative import AcceptOverride, plan_speculative, spec_model
from eagledata.capacity.stepfit import decode_tok_s
from eagledata.capacity.workload import Workload
from eagledata.profiles.kv import KVModel
from eagledata.profiles.profile import HardwareSection, Profile, ThroughputSection
from eagledata.profiles.rigs import Rig, reference_rig

CONCURRENT_REQUEST_TOKENS = 4096
"""The "concurrent 4k requests" column: every running request holding 4,096 tokens."""

MAX_RUNNING_HEADROOM = 1.2
"""Recommended ``--max-running-requests`` = steady state x this, rounded up to a multiple of 8."""

CLIENT_QUEUE_HEADROOM = 1.1
"""Recommended eagledata ``--concurrency`` = running target x this: a few requests wait in the
server queue so a finished slot refills at once, without pushing the KV pool into retraction."""


MAX_MEM_FRACTION = 0.95
"""The highest --mem-fraction-static the planner suggests: above it, CUDA graphs and activations
are left too little to start."""


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
    servers: int = 1,
) -> PlanRow:
    """The plan for one deployment (``servers`` of it); pure arithmetic, no I/O."""
    cell = model.cell_bytes(
        deployment.kv_cache_dtype,
        attn_tp_size=deployment.attn_tp_size,
        dcp_size=deployment.dcp_size,
    )
    gib = kv_gib_per_rank(hardware, deployment)
    per_rank = kv_tokens_per_rank(hardware, deployment, cell)
    notes: list[str] = []
    if per_rank <= 0:
        kept = hardware.pre_free_gib * (1 - deployment.mem_fraction_static)
        extra = hardware.dp_attention_extra_gib.get(deployment.attn_dp_size, 0.0)
        left = hardware.post_free_gib - (extra if deployment.attn_dp_size > 1 else 0.0)
        fixes = []
        if left > 0:
            # the fraction at which the pool begins: kept back = pre_free * (1 - fraction) < left
            needed = 1 - left / hardware.pre_free_gib
            if needed < MAX_MEM_FRACTION:
                at_max = left - hardware.pre_free_gib * (1 - MAX_MEM_FRACTION)
                fixes.append(
                    f"raise --mem-fraction-static above {needed:.2f} (at {MAX_MEM_FRACTION:g}: "
                    f"{at_max:.2f} GiB per rank, little room for activations)"
                )
        if deployment.attn_dp_size > 1 and extra > 0:
            fixes.append(f"drop DP attention (it replicates {extra:.2f} GiB more per GPU)")
        fixes.append("spread the weights over more GPUs")
        notes.append(
            f"KV pool {gib:.2f} GiB per rank ({left:.2f} GiB free per GPU after the weights, "
            f"{kept:.2f} kept back at --mem-fraction-static {deployment.mem_fraction_static:g}): "
            f"SGLang aborts with 'Not enough memory'; {', or '.join(fixes)}"
        )
    return plan_from_pool(
        label=label,
        kv_cache_dtype=deployment.kv_cache_dtype,
        parallelism=deployment.parallelism,
        mem_fraction_static=deployment.mem_fraction_static,
        workload=workload,
        tokens_per_rank=per_rank,
        system_tokens=per_rank * deployment.attn_dp_size * deployment.dcp_size * servers,
        servers=servers,
        cell_bytes=cell,
        kv_gib_per_rank=gib,
        max_running_requests=deployment.max_running_requests,
        attn_dp_size=deployment.attn_dp_size,
        cuda_graph_max_bs=deployment.cuda_graph_max_bs,
        context_length=deployment.context_length,
        throughput=throughput,
        plan_only=plan_only,
        status=status,
        notes=notes,
        profile_notes=profile_notes,
    )


def plan_from_pool(
    *,
    label: str,
    kv_cache_dtype: str,
    parallelism: str,
    mem_fraction_static: float,
    workload: Workload,
    tokens_per_rank: int,
    system_tokens: int,
    cell_bytes: int = 0,
    kv_gib_per_rank: float = 0.0,
    max_running_requests: int | None = None,
    attn_dp_size: int = 1,
    cuda_graph_max_bs: int | None = None,
    context_length: int | None = None,
    throughput: ThroughputSection | None = None,
    plan_only: bool = False,
    status: str = "",
    notes: Sequence[str] = (),
    profile_notes: Sequence[str] = (),
    servers: int = 1,
) -> PlanRow:
    """Concurrency, rates and wall clock from a KV pool, estimated or reported by a server.
    ``system_tokens`` is every server's pool together; the running requests, the recommended
    ``--max-running-requests`` and the rate are one server's, the totals ``servers`` of them."""
    fit = throughput or ThroughputSection()
    notes = list(notes)
    system = system_tokens
    starts = tokens_per_rank > 0
    servers = max(1, servers)

    steady_all = math.floor(system / workload.tokens_per_running_request)
    steady = steady_all // servers
    rec_mrr = min(_round_up(steady * MAX_RUNNING_HEADROOM, 8), fit.max_running_cap)
    rec_concurrency = (
        math.ceil(min(steady, rec_mrr) * CLIENT_QUEUE_HEADROOM) * servers if starts else 0
    )

    server_cap = max_running_requests
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

    tok_s = decode_tok_s(fit_running, fit) * servers

    graph_bs = cuda_graph_max_bs
    per_rank_batch = math.ceil(min(running, rec_mrr) / attn_dp_size)
    if graph_bs is not None and starts and graph_bs < per_rank_batch:
        notes.append(
            f"--cuda-graph-max-bs {graph_bs} < {per_rank_batch} running per rank: larger decode "
            "batches run without CUDA graphs"
        )
    if context_length is not None:
        over = workload.fraction_over(context_length)
        if over:
            notes.append(
                f"{over:.1%} of sampled prompts leave less than max_new_tokens "
                f"{workload.max_new_tokens} within --context-length {context_length}"
            )
        elif (
            over is None
            and workload.max_prompt_tokens is not None
            and workload.max_prompt_tokens + workload.max_new_tokens > context_length
        ):
            notes.append("longest prompt + max_new_tokens exceeds --context-length")
    if workload.mean_output_assumed:
        notes.append("mean output assumed = max_new_tokens (pass the expected mean output)")

    return PlanRow(
        profile=label,
        kv_cache_dtype=kv_cache_dtype,
        plan_only=plan_only,
        status=status,
        parallelism=parallelism,
        mem_fraction_static=mem_fraction_static,
        cell_bytes=cell_bytes,
        kv_gib_per_rank=kv_gib_per_rank,
        tokens_per_rank=tokens_per_rank,
        system_tokens=system,
        starts=starts,
        concurrent_4k=system // CONCURRENT_REQUEST_TOKENS,
        steady_concurrency=steady_all if servers > 1 else steady,
        running=running * servers,
        rated_running=fit_running * servers if starts else 0,
        servers=servers,
        recommended_max_running_requests=rec_mrr if starts else 0,
        recommended_concurrency=rec_concurrency,
        profile_max_running_requests=server_cap,
        **rate_fields(tok_s, fit.band, workload.total_output_tokens),
        notes=notes,
        profile_notes=list(profile_notes),
    )


def rate_fields(tok_s: float, band: float, total_output_tokens: float) -> dict[str, Any]:
    """A row's rate and its band (the step-time fit's relative error), and the wall-clock hours
    the job's output takes at each."""
    low, high = tok_s * (1 - band), tok_s * (1 + band)

    def hours(rate: float) -> float | None:
        return total_output_tokens / rate / 3600 if rate > 0 else None

    return {
        "tok_s": tok_s,
        "tok_s_low": low,
        "tok_s_high": high,
        "wall_clock_hours": hours(tok_s),
        "wall_clock_hours_low": hours(high),
        "wall_clock_hours_high": hours(low),
    }


def plan_profile(
    profile: Profile,
    workload: Workload,
    *,
    accept: AcceptOverride | None = None,
    rig: Rig | None = None,
) -> PlanRow:
    """The plan for one launch profile on ``rig`` (the reference rig by default); ``accept``
    replaces a speculative profile's drafter-card acceptance length (``--accept-length``, or
    measured on a running server)."""
    target = rig or reference_rig()
    placement = place(profile, target)
    carried = placement.profile  # its step-time fit carried over to the rig
    base_dir = str(Path(profile.source).parent) if profile.source else ""
    spec = spec_model(carried, accept.value if accept is not None else None)
    if spec is not None:  # drafting and verifying hold a few more KV slots per request
        slack = workload.slack_tokens + spec.extra_kv_tokens_per_request
        workload = workload.model_copy(update={"slack_tokens": slack})
    deployment = Deployment.from_profile(profile)
    kv = KVModel.from_section(profile.model, base_dir=base_dir)
    row = plan_deployment(
        label=profile.name,
        model=kv,
        hardware=placement.hardware,
        deployment=deployment,
        workload=workload,
        throughput=carried.throughput,
        plan_only=profile.plan_only,
        status=profile.status,
        profile_notes=profile.notes,
        servers=max(1, placement.servers),
    )
    layout = row.parallelism + (f" {profile.nnodes} nodes" if profile.nnodes > 1 else "")
    evidence, status = profile.evidence, profile.status
    carried_over = target.name not in written_for(profile)
    if carried_over:
        status = f"written for {', '.join(written_for(profile))}, carried over; there: {status}"
        evidence = "unverified"
    elif EVIDENCE.index(target.evidence) > EVIDENCE.index(evidence or "unverified"):
        # never better than the rig's: measured on the reference is arithmetic elsewhere, at best
        status = f"{target.evidence} on {target.name} (on the reference rig: {status})"
        evidence = target.evidence
    row = row.model_copy(
        update={
            "parallelism": f"{placement.servers}x {layout}" if placement.servers > 1 else layout,
            "attention": kv.kind,
            "rig": target.name,
            "nodes": profile.nnodes,
            "gpus": placement.gpus,
            "carried_over": carried_over,
            "status": status,
            "evidence": evidence,
            "settle": profile.settle,
            "sglang_versions": list(profile.sglang_versions),
            "assumptions": [*profile.assumptions, *placement.assumptions],
            "rig_assumptions": list(placement.assumptions),
        }
    )
    if not placement.fits:
        return _misfit_row(row, placement.misfit)
    if placement.notes and row.starts:
        row = row.model_copy(update={"notes": [*placement.notes, *row.notes]})
    elif placement.servers > 1 and row.notes:  # why it does not start, for each server
        each = f"each of its {placement.servers} servers of {profile.gpus} GPUs: {row.notes[0]}"
        row = row.model_copy(update={"notes": [each, *row.notes[1:]]})
    if spec is None or not row.starts:
        return _with_hope(row, profile, workload, accept, target)
    fit, notes = carried.throughput, list(row.notes)
    per_server = row.running // row.servers
    plan, tok_s = plan_speculative(
        profile=carried,
        hardware=placement.hardware,
        model=spec,
        running=min(per_server, fit.max_running_fit),
        # the draft's pool has a slot per target token: every DCP rank's share, on each GPU
        draft_slots_per_rank=row.tokens_per_rank * profile.dcp_size,
        fit=fit,
        override=accept,
        notes=notes,
    )
    assumptions = list(row.assumptions)
    if not plan.accept_length_measured:
        assumptions.insert(
            0,
            f"acceptance {plan.accept_length:.2f} tokens per verify step "
            f"({plan.accept_length_source}), never measured on this job's answers",
        )
    row = row.model_copy(
        update={
            "speculative": plan,
            **rate_fields(tok_s * row.servers, fit.band, workload.total_output_tokens),
            "notes": notes,
            "assumptions": assumptions,
        }
    )
    return _with_hope(row, profile, workload, accept, target)


def _with_hope(
    row: PlanRow, profile: Profile, workload: Workload, accept: AcceptOverride | None, rig: Rig
) -> PlanRow:
    """A row rated at a measured step speed (``[throughput] step_speed``) names its rate at the
    measurement's favourable end too (``step_speed_hope``): the central figure follows the
    evidence, the hope is said beside it."""
    fit = profile.throughput
    if fit.step_speed_hope is None or not row.starts:
        return row
    hopeful = profile.model_copy(
        update={
            "throughput": fit.model_copy(
                update={"step_speed": fit.step_speed_hope, "step_speed_hope": None}
            )
        }
    )
    hope = plan_profile(hopeful, workload, accept=accept, rig=rig)
    note = (
        f"steps rated at {fit.step_speed:g}x the fitted ones (the measurement it cites); at its "
        f"favourable end, {fit.step_speed_hope:g}x: {hope.tok_s:,.0f} tok/s"
    )
    return row.model_copy(update={"notes": [*row.notes, note]})


def _misfit_row(row: PlanRow, why: str) -> PlanRow:
    """A profile whose servers do not fit the rig's nodes: no pool, no rate, and why."""
    return row.model_copy(
        update={
            "servers": 0,
            "gpus": 0,
            "kv_gib_per_rank": 0.0,
            "tokens_per_rank": 0,
            "system_tokens": 0,
            "starts": False,
            "concurrent_4k": 0,
            "steady_concurrency": 0,
            "running": 0,
            "rated_running": 0,
            "recommended_max_running_requests": 0,
            "recommended_concurrency": 0,
            **rate_fields(0.0, 0.0, 0.0),
            "notes": [f"does not fit {row.rig}: {why}"],
        }
    )


def plan_profiles(
    profiles: Sequence[Profile],
    workload: Workload,
    *,
    accept: AcceptOverride | None = None,
    rig: Rig | None = None,
) -> list[PlanRow]:
    """One :class:`PlanRow` per profile on ``rig`` (default: the reference), in order."""
    return [plan_profile(profile, workload, accept=accept, rig=rig) for profile in profiles]
