"""A profile on a rig: the GPUs it gets, what they hold free, and the step-time fit carried over.

The memory and the step-time fit were measured on the reference rig (``configs/rigs.toml``);
every other rig is arithmetic on it, and each step of that arithmetic is an assumption the plan
names (``docs/capacity.md``, "Rigs")::

    pre_free   = the rig's free memory per GPU before the weights load
    post_free  = pre_free - resident(tp),  resident(tp) = replicated + split x resident_tp / tp
    a, b       = the reference fit's a and b x (reference bandwidth / rig bandwidth)
    knee, cap  = the reference's max_running_fit, max_running_cap x (rig bf16 TFLOPS x GPUs of
                 one server) / (reference bf16 TFLOPS x GPUs of a reference node)

A server must fit the rig's nodes: ``nnodes`` nodes of ``gpus / nnodes`` GPUs. The rig holds as
many such servers as it has room for (one per node for a TP8 profile on two nodes), each its own
SGLang server; the plan counts them together, as one job behind sglang-router would run them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagledata.profiles.profile import HardwareSection, Profile
from eagledata.profiles.rigs import Rig, reference_rig


@dataclass(frozen=True)
class Placement:
    """One profile on one rig."""

    rig: Rig
    profile: Profile
    """The profile with its step-time fit (and its draft's) carried over to the rig."""
    hardware: HardwareSection
    servers: int
    """Servers of this profile the rig holds (0: it does not fit)."""
    misfit: str = ""
    """Why it does not fit the rig (empty when it does)."""
    assumptions: list[str] = field(default_factory=list)
    """What carrying the reference's measurements over to this rig assumes."""
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.servers > 0

    @property
    def gpus(self) -> int:
        return self.servers * self.profile.gpus


def hardware_on(rig: Rig, profile: Profile) -> HardwareSection:
    """What one GPU of ``rig`` has free before and after ``profile``'s model loads at its TP."""
    model = profile.model
    pre = rig.pre_free_gib
    return HardwareSection(
        gpu=rig.gpu,
        num_gpus=rig.gpus,
        pre_free_gib=pre,
        post_free_gib=round(pre - model.resident_gib_at(profile.tp_size), 4),
        mm_reservation_gib=model.mm_reservation_gib,
        dp_attention_extra_gib=model.dp_attention_extra_gib,
    )


def _misfit(profile: Profile, rig: Rig) -> str:
    per_node, nodes = profile.gpus_per_node, profile.nnodes
    shape = f"{profile.gpus} GPUs" + (f" on {nodes} nodes of {per_node}" if nodes > 1 else "")
    if per_node > rig.gpus_per_node:
        return f"needs {shape}; {rig.name} has {rig.gpus_per_node} per node"
    if nodes > rig.nodes:
        return f"needs {shape}; {rig.name} has {rig.nodes} node" + ("s" if rig.nodes > 1 else "")
    return ""


def place(profile: Profile, rig: Rig, reference: Rig | None = None) -> Placement:
    """``profile`` on ``rig``: its hardware, its servers, its fit carried over."""
    ref = reference or reference_rig()
    hardware = hardware_on(rig, profile)
    misfit = _misfit(profile, rig)
    if misfit:
        return Placement(rig, profile, hardware, 0, misfit)
    servers = (rig.nodes // profile.nnodes) * (rig.gpus_per_node // profile.gpus_per_node)
    assumptions = list(rig.assumptions)
    notes: list[str] = []

    step = ref.memory_bandwidth_tbs / rig.memory_bandwidth_tbs
    compute = (rig.bf16_tflops * profile.gpus) / (ref.bf16_tflops * ref.gpus_per_node)
    fit = profile.throughput.at_step_speed()
    knee = max(1, round(fit.max_running_fit * compute))
    cap = max(8, round(fit.max_running_cap * compute / 8) * 8)  # a batch size: a multiple of 8
    carried = fit.model_copy(
        update={
            "step_base_s": fit.step_base_s * step,
            "step_per_request_s": fit.step_per_request_s * step,
            "max_running_fit": knee,
            "max_running_cap": cap,
        }
    )
    draft = profile.draft
    if draft is not None:
        draft = draft.model_copy(
            update={
                "draft_step_s": draft.draft_step_s * step,
                "draft_step_per_request_s": draft.draft_step_per_request_s * step,
            }
        )
    if step != 1:
        assumptions.append(
            f"the step-time fit carried over from {ref.name} by memory bandwidth: a and b x"
            f"{step:.3f} ({ref.memory_bandwidth_tbs:g} / {rig.memory_bandwidth_tbs:g} TB/s; "
            "decode at these batches reads weights and KV, and the all-reduces cost no more "
            "than the reference's over PCIe), unverified"
        )
    if knee != fit.max_running_fit:
        assumptions.append(
            f"decode turns compute-bound at ~{knee} running, rated there at most ({ref.name}'s "
            f"{fit.max_running_fit} x {compute:.2f}: bf16 TFLOPS x GPUs of one server, "
            f"{rig.bf16_tflops:g} x {profile.gpus} against {ref.bf16_tflops:g} x "
            f"{ref.gpus_per_node}), unverified"
        )
    model = profile.model
    if profile.tp_size != model.resident_tp:
        split = model.resident_gib - model.replicated_gib
        assumptions.append(
            f"{model.resident_gib_at(profile.tp_size):.2f} GiB per GPU after loading at TP"
            f"{profile.tp_size}: {model.replicated_gib:g} GiB on every GPU plus the "
            f"{split * model.resident_tp:.1f} GiB split over TP ranks, divided {profile.tp_size} "
            f"ways (the TP{model.resident_tp} fit re-divided), unverified"
        )
    if profile.nnodes > 1:
        assumptions.append(
            f"TP{profile.tp_size} over {profile.nnodes} nodes steps as fast as TP"
            f"{profile.tp_size // profile.nnodes} on one: each GPU reads 1/{profile.nnodes} of "
            "the weights, and that pays for all-reduces that cross the nodes' network, unverified"
        )
    if servers > 1:
        notes.append(
            f"{servers} servers of {profile.gpus} GPUs on {rig.name}, one job over them behind "
            "sglang-router (launch-server --router): the pool and the rate are theirs together"
        )
    carried_profile = profile.model_copy(update={"throughput": carried, "draft": draft})
    return Placement(rig, carried_profile, hardware, servers, "", assumptions, notes)
