"""Launch profiles derived for any model on any rig (``eagledata plan --model M --rig R``).

The shipped profiles are hand-written for Kimi-K2.5, their memory fitted to two measured runs.
For another model the same planner runs on profiles made from its ``config.json`` alone, every
input that was not measured named as an assumption in the row:

* the layouts: TP over 1, 2, 4 ... GPUs of a node (the attention heads divisible by TP, as SGLang
  requires), one server per TP group (the plan counts them together behind sglang-router); for
  MLA models, which SGLang's DP attention serves, TP over the node with 2, 4, 8 attention-DP ranks;
  on a rig of several nodes none of which holds the weights, one server over all of them;
* the KV cell: ``profiles/kv.py``, SGLang's own arithmetic (``tests/test_kv_cells.py``);
* what one GPU holds: the weights by part (``profiles/weights.py``) plus the runtime buffers
  the reference runs left (``RUNTIME_BUFFERS_GIB``); under DP attention the attention and
  embedding weights divided over fewer ranks;
* ``--mem-fraction-static`` ``MEM_FRACTION``; the step-time fit: the reference rig's, its floor
  scaled by the weights one GPU reads per step and its per-request term by the KV cell one rank
  reads, relative to Kimi-K2.5's, then carried to the rig as every profile's is.

Kimi-K2.5 itself derived this way holds, at TP8 on the reference rig, its weights within a few
percent of the fitted figure (the vision tower and the buffers aside), and the same KV cell:
the hand-written profiles keep the fitted, measured memory.
"""

from __future__ import annotations

import re

from eagledata.errors import ConfigError
from eagledata.profiles.kv import KIMI_K25_BF16_BYTES_PER_TOKEN, KVModel
from eagledata.profiles.profile import Profile, ThroughputSection
from eagledata.profiles.releases import oldest_form, releases
from eagledata.profiles.rigs import Rig
from eagledata.profiles.sections import ModelSection
from eagledata.profiles.sglang_args import ArgValue
from eagledata.profiles.target import TargetModel
from eagledata.profiles.weights import WeightEstimate, estimate_weights

RUNTIME_BUFFERS_GIB = 0.70
"""Per GPU beyond the weights once a model has loaded (the reference runs' fit: 0.70 GiB)."""
MEM_FRACTION = 0.85
"""``--mem-fraction-static`` of a derived profile: the reference run's, which started."""
KIMI_RESIDENT_TP8_GIB = 72.53
"""What Kimi-K2.5 holds per GPU at TP8 (fitted to the reference runs): the step-time fit's
weights, against which another model's step floor is scaled."""
MIN_STEP_S = 0.010
"""No decode step is taken to be shorter (kernel launches, all-reduces), whatever the model."""


def derived_profile(
    target: TargetModel, rig: Rig, tp: int, dp: int = 1, nnodes: int = 1
) -> Profile:
    """The profile of ``target`` at TP ``tp`` (with ``dp`` attention-DP ranks): what
    ``launch-server --model`` starts. ``ConfigError`` when SGLang could not split it so."""
    heads = _attention_heads(target)
    if tp < 1 or not _tp_divides(tp, heads, target.kv):
        raise ConfigError(
            f"--tp {tp}: {target.expected_model} has {heads} attention heads and "
            f"{'an MLA latent' if target.kv.attention == 'mla' else target.kv.num_kv_heads} KV "
            "heads; pick a TP size dividing the attention heads"
        )
    if dp > 1 and (target.kv.attention != "mla" or tp % dp or (tp // dp) < 1):
        raise ConfigError(
            f"--dp-attention {dp}: DP attention is planned for MLA models only, with dp "
            f"dividing --tp {tp}"
        )
    if nnodes < 1 or tp % nnodes:
        raise ConfigError(f"--nnodes {nnodes}: must divide --tp {tp} (the GPUs of each node)")
    return _profile(target, rig, estimate_weights(target.config), tp, dp, nnodes)


def derive_profiles(target: TargetModel, rig: Rig) -> list[Profile]:
    """One profile per layout of ``target`` on one node of ``rig``: plain TP where the weights
    fit (the full node's TP also when none does, to say so), DP attention for MLA models."""
    kv = target.kv
    weights = estimate_weights(target.config)
    heads = _attention_heads(target)
    sizes = [tp for tp in _powers_of_two(rig.gpus_per_node) if _tp_divides(tp, heads, kv)]
    fitting = [
        tp for tp in sizes if weights.per_gpu_gib(tp) + RUNTIME_BUFFERS_GIB < rig.pre_free_gib
    ]
    plain = [tp for tp in sizes if fitting and tp >= fitting[0]] or sizes[-1:]
    profiles = [_profile(target, rig, weights, tp, 1) for tp in plain]
    whole = rig.gpus_per_node * rig.nodes
    if not fitting and rig.nodes > 1 and _tp_divides(whole, heads, kv):
        # nothing fits one node: one server over every node of the rig
        profiles.append(_profile(target, rig, weights, whole, 1, nnodes=rig.nodes))
    node = rig.gpus_per_node
    if kv.attention == "mla" and node in sizes:
        profiles += [
            _profile(target, rig, weights, node, dp)
            for dp in _powers_of_two(node)
            if dp > 1 and heads % (node // dp) == 0
        ]
    return profiles


def _profile(
    target: TargetModel, rig: Rig, weights: WeightEstimate, tp: int, dp: int, nnodes: int = 1
) -> Profile:
    kv = target.kv
    slug = re.sub(r"[^a-z0-9.]+", "-", (target.hub_id or target.path.name).lower()).strip("-")
    name = f"{slug}-tp{tp}" if dp == 1 else f"{slug}-dpa{dp}"
    args: dict[str, ArgValue] = {"model-path": target.expected_model}
    if target.trust_remote_code:
        args["trust-remote-code"] = True
    args |= {"tp-size": tp, "kv-cache-dtype": "bf16", "mem-fraction-static": MEM_FRACTION}
    if dp > 1:
        args |= {"dp-size": dp, "enable-dp-attention": True}
    if nnodes > 1:
        args["nnodes"] = nnodes
    args["enable-metrics"] = True
    resident = weights.per_gpu_gib(tp) + RUNTIME_BUFFERS_GIB
    replicated = min(resident, weights.replicated_gib() + RUNTIME_BUFFERS_GIB)
    dp_extra = {dp: round(weights.dp_attention_extra_gib(tp, dp), 4)} if dp > 1 else {}
    cell = kv.cell_bytes("bf16", attn_tp_size=tp // dp)
    step_base = max(MIN_STEP_S, 0.077 * weights.per_gpu_gib(tp) / KIMI_RESIDENT_TP8_GIB)
    step_per_request = 0.00018 * cell / KIMI_K25_BF16_BYTES_PER_TOKEN
    assumptions = [
        f"weights {weights.total_gib:,.1f} GiB ({weights.params / 1e9:,.1f}B parameters, "
        f"{weights.format}), counted from config.json: {weights.per_gpu_gib(tp):.2f} GiB per GPU "
        f"at TP{tp}, plus {RUNTIME_BUFFERS_GIB} GiB of runtime buffers as on the reference rig",
        f"--mem-fraction-static {MEM_FRACTION}, the reference run's (check CUDA-graph capture at "
        "start-up)",
        "the step-time fit, the reference rig's for Kimi-K2.5, scaled: "
        f"its floor by the weights a GPU reads per step ({step_base:.3f} s, at least "
        f"{MIN_STEP_S} s), its per-request term by the KV cell a rank reads "
        f"({step_per_request:.6f} s)",
    ]
    if dp > 1:
        assumptions.append(
            f"DP attention {dp}: attention and embedding weights divided over TP{tp // dp}, "
            f"+{dp_extra[dp]:.2f} GiB per GPU"
        )
    if kv.hybrid:
        assumptions.append(
            "the sliding-window pool at SGLang's default --swa-full-tokens-ratio 0.8 (a "
            "token of the pool is a full-attention token)"
        )
    if target.config.get("vision_config") is not None:
        assumptions.append("the vision tower is not counted (its weights are not in the sum)")
    section = ModelSection(
        name=target.expected_model,
        attention=kv.attention,
        config_json=str(target.path / "config.json"),
        resident_gib=round(resident, 4),
        resident_tp=tp,
        replicated_gib=round(replicated, 4),
        dp_attention_extra_gib=dp_extra,
    )
    servers = rig.gpus_per_node // tp
    layout = f"TP{tp}" + (f" with {dp} attention-DP ranks" if dp > 1 else "")
    layout += f" over {nnodes} nodes" if nnodes > 1 else ""
    return Profile(
        name=name,
        source=str(target.path / "config.json"),
        description=f"{target.expected_model}: {layout}, bf16 KV ({kv.kind}), derived for "
        f"{rig.name}",
        status=f"derived from config.json ({kv.kind}, {cell:,} B per KV token per rank): never run",
        evidence="unverified",
        settle=f"launch it (eagledata launch-server --model {target.given} --tp {tp}"
        + (f" --dp-attention {dp}" if dp > 1 else "")
        + (f" --nnodes {nnodes}, on each node with --node-rank R" if nnodes > 1 else "")
        + "): the KV tokens its start-up log allocates, and status's tok/s",
        notes=[f"{servers} servers of TP{tp} per node"] if servers > 1 else [],
        # none has a form: the newest, which the profile's check then refuses, saying why
        min_release=(oldest_form(args) or releases()[-1]).version,
        sglang_args=args,
        model=section,
        throughput=ThroughputSection(step_base_s=step_base, step_per_request_s=step_per_request),
        assumptions=assumptions,
        rigs=[rig.name],
    )


def _attention_heads(target: TargetModel) -> int:
    value = target.text_config.get("num_attention_heads")
    return value if isinstance(value, int) and value > 0 else 1


def _tp_divides(tp: int, heads: int, kv: KVModel) -> bool:
    """SGLang splits the query heads evenly over TP; K/V heads either split evenly or are
    replicated (fewer heads than ranks)."""
    if heads % tp:
        return False
    kv_heads = kv.num_kv_heads
    return kv.attention == "mla" or kv_heads % tp == 0 or tp % kv_heads == 0


def _powers_of_two(limit: int) -> list[int]:
    sizes, size = [], 1
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes
