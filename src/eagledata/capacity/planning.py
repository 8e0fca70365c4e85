"""Glue for ``eagledata plan``: a workload measured from a dataset, and a live server's row.

The arithmetic lives in ``capacity``; this module only feeds it real inputs: the templated
prompt lengths of a dataset sample (with the run's own tokenizer and template), and, with
``--server``, the KV pool a running server reports instead of an estimate.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from eagledata.capacity import PlanRow, Workload
from eagledata.capacity.plan_row import written_for
from eagledata.capacity.planner import plan_from_pool, plan_profiles, rate_fields
from eagledata.capacity.speculative import AcceptOverride, SpecModel, plan_live_speculative
from eagledata.config import AppConfig
from eagledata.errors import ConfigError, ItemError
from eagledata.profiles.profile import Profile, ThroughputSection
from eagledata.profiles.rigs import Rig, reference_rig
from eagledata.server.serverfacts import ServerFacts
from eagledata.source.conversations import split_turns
from eagledata.source.dataset import ResolvedDataset, check_local_source
from eagledata.source.mix import Mix, member_row_count, mix_rows
from eagledata.source.prompts import row_messages, to_messages
from eagledata.source.tokenization import PromptTokenizer

CARD_ACCEPT_LENGTH = 2.8
"""The drafter cards' acceptance (2.5-3.2 at 3 steps, top-k 1) for a live speculative server that
has not verified anything yet."""


def measure_workload(
    config: AppConfig,
    mix: Mix,
    *,
    sample_rows: int,
    mean_output_tokens: float | None,
) -> Workload:
    """Tokenize the first ``sample_rows`` rows exactly as ``generate`` would, each dataset with
    its own settings. A dataset that regenerates every turn counts one request per turn: turn
    k's prompt is its conversation's messages up to its k-th user message plus k earlier answers
    of the expected answer length (the regenerated answers do not exist yet)."""
    for member in mix.members:  # before the tokenizer is fetched
        check_local_source(ResolvedDataset(member.name, member.dataset), config.source)
    tokenizer = PromptTokenizer(config.tokenizer)
    generation = config.generation
    longest = max(member.dataset.generation(generation).max_new_tokens for member in mix.members)
    answer_tokens = mean_output_tokens if mean_output_tokens is not None else longest
    lengths: list[int] = []
    requests: dict[str, list[int]] = {member.name: [0, 0] for member in mix.members}
    for member, row in itertools.islice(mix_rows(mix, config.run.limit), sample_rows):
        if row.data is None:
            continue
        own = member.dataset.generation(generation)
        kwargs = member.dataset.template_kwargs(config.tokenizer.chat_template_kwargs)
        try:
            if own.turns == "all":
                segments = split_turns(row_messages(row.data, member.dataset))
                turns = [
                    len(tokenizer.encode([m for s in segments[: k + 1] for m in s], kwargs))
                    + round(k * answer_tokens)
                    for k in range(len(segments))
                ]
            else:
                turns = [len(tokenizer.encode(to_messages(row.data, member.dataset), kwargs))]
        except ItemError:
            continue  # bad rows never reach the server, so they do not load it either
        lengths.extend(turns)
        requests[member.name][0] += 1
        requests[member.name][1] += len(turns) * own.samples_per_prompt
    if not lengths:
        raise ConfigError(f"dataset {mix.name}: no usable prompt in the first {sample_rows}")
    total = 0.0
    for member in mix.members:
        rows, sampled = requests[member.name]
        if not rows:
            continue
        count = member_row_count(member, config.run.limit)
        total += (count if count is not None else rows) * sampled / rows
    samples = {member.dataset.generation(generation).samples_per_prompt for member in mix.members}
    # one request a turn of a sample: samples stay apart where every dataset has the same
    per_prompt = samples.pop() if len(samples) == 1 else 1
    return Workload.from_prompt_lengths(
        lengths,
        max_new_tokens=longest,
        mean_output_tokens=mean_output_tokens,
        num_prompts=max(1, round(total / per_prompt)),
        samples_per_prompt=per_prompt,
    )


def live_row(
    url: str, facts: ServerFacts, workload: Workload, accept: AcceptOverride | None = None
) -> PlanRow:
    """A plan row from the pool a running server reports, with the same fit as the profiles;
    a speculative server is rated at its measured acceptance (else ``accept``, else the cards')."""
    row = plan_from_pool(
        label=f"live {url}",
        kv_cache_dtype=facts.kv_cache_dtype or "unknown",
        parallelism=f"TP{facts.tp_size or '?'}"
        + (f" DPA{facts.dp_ranks}" if facts.attention_dp else "")
        + (f" DCP{facts.dcp_size}" if (facts.dcp_size or 1) > 1 else ""),
        mem_fraction_static=facts.mem_fraction_static or 0.0,
        workload=workload,
        # per GPU, as the profile rows count it; the server's pool, every DCP share counted
        tokens_per_rank=(facts.rank_kv_tokens or 0) // max(1, facts.dcp_size or 1),
        system_tokens=facts.system_kv_tokens or 0,
        max_running_requests=facts.max_running_requests,
        context_length=facts.context_length,
        status="measured pool (from /server_info)",
    ).model_copy(
        update={
            "evidence": "measured",
            "sglang_versions": [facts.version] if facts.version else [],
        }
    )
    spec = facts.speculative
    if spec is None or not row.starts:
        return row
    if spec.accept_length is not None:
        value, source, measured = spec.accept_length, f"measured on {url}", True
    elif accept is not None:
        value, source, measured = accept.value, accept.source, accept.measured
    else:
        value, source, measured = CARD_ACCEPT_LENGTH, "drafter cards, unverified", False
    steps = spec.num_steps or 3
    topk = spec.eagle_topk or 1
    model = SpecModel(
        accept_length=value,
        num_steps=steps,
        eagle_topk=topk,
        num_draft_tokens=spec.num_draft_tokens or steps + 1,
    )
    fit = ThroughputSection()
    plan, tok_s = plan_live_speculative(
        algorithm=spec.algorithm,
        draft_model=spec.draft_model_path or "unknown",
        model=model,
        running=min(row.running, fit.max_running_fit),
        fit=fit,
        source=source,
        measured=measured,
    )
    notes = list(row.notes)
    if not measured:
        notes.append("acceptance not measured yet: the server has verified nothing")
    return row.model_copy(
        update={
            "speculative": plan,
            **rate_fields(tok_s, fit.band, workload.total_output_tokens),
            "notes": notes,
            "evidence": "measured" if measured else "unverified",
        }
    )


def measured_acceptance(live: Sequence[tuple[str, ServerFacts]]) -> AcceptOverride | None:
    """The acceptance length the first speculative server has measured, if any."""
    for url, facts in live:
        spec = facts.speculative
        if spec is not None and spec.accept_length is not None:
            return AcceptOverride(spec.accept_length, f"measured on {url}", True)
    return None


def profiles_for(rig: Rig, profiles: Sequence[Profile]) -> tuple[list[Profile], list[Profile]]:
    """``(planned, elsewhere)``: the profiles written for ``rig`` (their ``rigs``), and the rest.
    A rig no launchable profile is written for is planned with the reference rig's, carried
    over (so the plan says whether they start there)."""
    planned = [p for p in profiles if rig.name in written_for(p)]
    if not any(not p.plan_only for p in planned):
        reference = reference_rig().name
        planned += [p for p in profiles if reference in written_for(p) and p not in planned]
    return planned, [p for p in profiles if p not in planned]


def build_plan(
    profiles: Sequence[Profile],
    workload: Workload,
    live: Sequence[tuple[str, ServerFacts]] = (),
    *,
    accept_length: float | None = None,
    rig: Rig | None = None,
) -> list[PlanRow]:
    """Rows for the profiles on ``rig`` (default: the reference), then (first) one per running
    server. Speculative rows use ``accept_length`` when given, else what a running speculative
    server measured, else their drafter card's figure (marked unverified)."""
    target = rig or reference_rig()
    if accept_length is not None:
        if accept_length < 1:
            raise ConfigError("--accept-length: tokens per verify step, at least 1")
        accept: AcceptOverride | None = AcceptOverride(
            accept_length, "--accept-length, assumed", False
        )
    else:
        accept = measured_acceptance(live)
    rows = plan_profiles(profiles, workload, accept=accept, rig=target)
    for url, facts in live:
        row = live_row(url, facts, workload, accept)
        rows.insert(0, row.model_copy(update={"rig": target.name, "nodes": facts.nnodes or 1}))
    return rows
