"""The compute lever: tok/s with EAGLE speculative decoding, as a documented step-cost model.

Plain decode (the two-run fit every profile shares)::

    step(N)      = a + b * N                  a = 0.077 s (weight-read + all-reduce floor),
    tok/s        = N / step(N)                b = 0.00018 s per running request

With speculative decoding one cycle drafts ``steps`` tokens per request (``steps`` draft forwards
plus one draft extend over the accepted tokens), then verifies ``k = num_draft_tokens`` tokens per
request in one target forward, and keeps ``L`` tokens per request on average (the acceptance
length: accepted drafts plus the target's own token, SGLang's ``completion_tokens /
spec_verify_ct``)::

    verify(N)    = a + b * N * k              the floor once, the per-request term per token
    draft(N)     = (steps + 1) * (d + d_n * N * topk)
    tok/s_spec   = N * L / (verify(N) + draft(N))
    speedup(N)   = L * step(N) / (verify(N) + draft(N))

At small N the floor ``a`` dominates both steps, so the speedup approaches ``L * a / (a + draft)``;
as N grows the verify's ``b * N * k`` term grows k times faster than plain decode's, and the
speedup shrinks toward ``L b / (k b + (steps + 1) d_n topk)``, about ``L / k`` (below 1: at a
large enough batch, speculation costs throughput; with the defaults past ~600 running requests).
Charging every verified token a full request's ``b`` is pessimistic for the KV read (a request's
latent is read once per verify, however many tokens it checks) and optimistic for expert coverage
at small batches (more tokens touch more of the 384 experts); only a real run settles it, and
``status`` / ``plan --server`` then use the measured acceptance.

The draft's memory is not in the target's KV pool: SGLang sizes the target pool first, then loads
the draft's weights, its KV pool (as many tokens as the target's, at the draft's own cell size)
and its CUDA graphs out of the ``(1 - mem_fraction_static)`` headroom.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from eagledata.capacity.memory import GIB
from eagledata.capacity.stepfit import decode_tok_s
from eagledata.profiles.profile import HardwareSection, Profile, ThroughputSection

SPEEDUP_BATCHES = (8, 16, 32, 64, 128, 150)
"""Running-request counts at which the plan shows the speedup, to make the trade-off visible."""

REFERENCE_OOM_HEADROOM_GIB = 6.6
"""Headroom at which the reference run's 0.93 start ran out of memory (94.26 GiB x 0.07)."""

PESSIMISTIC_ACCEPT_LENGTH = 2.0
"""What the plan also rates each speculative row at: long thinking answers may accept less than
the chat benchmarks on the drafter cards."""


@dataclass(frozen=True)
class SpecModel:
    """The inputs of the step-cost model for one speculative deployment."""

    accept_length: float
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_step_s: float = 0.0015
    draft_step_per_request_s: float = 0.000003

    def cycle_s(self, running: float, fit: ThroughputSection) -> float:
        """Seconds of one draft + verify cycle with ``running`` requests."""
        verify = fit.step_base_s + fit.step_per_request_s * running * self.num_draft_tokens
        per_forward = self.draft_step_s + self.draft_step_per_request_s * running * self.eagle_topk
        return verify + (self.num_steps + 1) * per_forward

    def tok_s(self, running: float, fit: ThroughputSection) -> float:
        if running <= 0:
            return 0.0
        return running * self.accept_length / self.cycle_s(running, fit)

    def speedup(self, running: float, fit: ThroughputSection) -> float:
        """tok/s with speculation over tok/s without, at the same running requests."""
        plain = fit.step_base_s + fit.step_per_request_s * running
        return self.accept_length * plain / self.cycle_s(running, fit)

    @property
    def extra_kv_tokens_per_request(self) -> int:
        """KV slots a running request also holds while drafting and verifying."""
        return self.num_draft_tokens + self.num_steps * self.eagle_topk


class SpecPlan(BaseModel):
    """The speculative part of a plan row (``speculative`` in ``plan --json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str
    draft_model: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    accept_length: float
    accept_length_source: str
    """Where the acceptance length came from: the drafter card (unverified), ``--accept-length``,
    or a running server (measured)."""
    accept_length_measured: bool
    tok_s_without: float
    """The same deployment at the same running requests without speculative decoding."""
    speedup: float
    tok_s_pessimistic: float
    """tok/s at an acceptance length of PESSIMISTIC_ACCEPT_LENGTH."""
    speedup_by_running: dict[int, float]
    draft_weights_gib_per_gpu: float | None = None
    draft_kv_gib_per_gpu: float | None = None
    draft_graph_gib: float | None = None
    headroom_gib: float | None = None
    """``pre_free * (1 - mem_fraction_static)``: what the target leaves after its KV pool."""
    headroom_after_draft_gib: float | None = None


@dataclass(frozen=True)
class AcceptOverride:
    """An acceptance length that replaces the drafter card's: from ``--accept-length`` or a
    running speculative server."""

    value: float
    source: str
    measured: bool


def spec_model(profile: Profile, accept_length: float | None = None) -> SpecModel | None:
    """The model of a profile's speculative settings; None for a profile without them."""
    draft = profile.draft
    if draft is None or profile.speculative_algorithm is None:
        return None

    def arg(key: str) -> int:
        value = profile.sglang_args[key]
        assert isinstance(value, int)
        return value

    return SpecModel(
        accept_length=accept_length if accept_length is not None else draft.accept_length,
        num_steps=arg("speculative-num-steps"),
        eagle_topk=arg("speculative-eagle-topk"),
        num_draft_tokens=arg("speculative-num-draft-tokens"),
        draft_step_s=draft.draft_step_s,
        draft_step_per_request_s=draft.draft_step_per_request_s,
    )


def plan_speculative(
    *,
    profile: Profile,
    hardware: HardwareSection,
    model: SpecModel,
    running: float,
    draft_slots_per_rank: int,
    fit: ThroughputSection,
    override: AcceptOverride | None,
    notes: list[str],
) -> tuple[SpecPlan, float]:
    """The speculative part of a row and its tok/s at ``running``; appends findings to notes.
    ``draft_slots_per_rank``: the draft's KV pool on one GPU, one slot per target token (under
    DCP, every DCP rank's share: SGLang 0.5.23's draft and target share a slot index space)."""
    draft = profile.draft
    assert draft is not None and profile.speculative_algorithm is not None
    headroom = hardware.pre_free_gib * (1.0 - profile.mem_fraction_static)
    draft_kv = draft_slots_per_rank * draft.kv_bytes_per_token / GIB
    left = headroom - draft.weights_gib_per_gpu - draft_kv - draft.graph_gib
    notes.append(
        f"draft: {draft.weights_gib_per_gpu:.2f} GiB weights + {draft_kv:.2f} GiB KV + "
        f"{draft.graph_gib:.2f} GiB graphs per GPU out of the {headroom:.2f} GiB headroom: "
        f"{left:.2f} GiB left for activations and graphs"
    )
    if left < REFERENCE_OOM_HEADROOM_GIB:
        notes.append(
            f"{left:.2f} GiB headroom is below the {REFERENCE_OOM_HEADROOM_GIB} GiB at which the "
            "reference run's 0.93 start ran out of memory: lower --mem-fraction-static"
        )
    source = override.source if override is not None else draft.accept_length_source
    measured = override.measured if override is not None else False
    plan, tok_s = _rated(
        model, running, fit, profile.speculative_algorithm, draft.name, source, measured
    )
    plan = plan.model_copy(
        update={
            "draft_weights_gib_per_gpu": draft.weights_gib_per_gpu,
            "draft_kv_gib_per_gpu": draft_kv,
            "draft_graph_gib": draft.graph_gib,
            "headroom_gib": headroom,
            "headroom_after_draft_gib": left,
        }
    )
    return plan, tok_s


def plan_live_speculative(
    *,
    algorithm: str,
    draft_model: str,
    model: SpecModel,
    running: float,
    fit: ThroughputSection,
    source: str,
    measured: bool,
) -> tuple[SpecPlan, float]:
    """The speculative part of a running server's row (its draft memory is already spent)."""
    return _rated(model, running, fit, algorithm, draft_model, source, measured)


def _rated(
    model: SpecModel,
    running: float,
    fit: ThroughputSection,
    algorithm: str,
    draft_model: str,
    source: str,
    measured: bool,
) -> tuple[SpecPlan, float]:
    """The speculative rating at ``running``: tok/s with and without the drafter, and at the
    pessimistic acceptance length."""
    tok_s = model.tok_s(running, fit)
    without = decode_tok_s(running, fit)
    pessimistic = SpecModel(**{**model.__dict__, "accept_length": PESSIMISTIC_ACCEPT_LENGTH})
    plan = SpecPlan(
        algorithm=algorithm,
        draft_model=draft_model,
        num_steps=model.num_steps,
        eagle_topk=model.eagle_topk,
        num_draft_tokens=model.num_draft_tokens,
        accept_length=model.accept_length,
        accept_length_source=source,
        accept_length_measured=measured,
        tok_s_without=without,
        speedup=tok_s / without if without else 0.0,
        tok_s_pessimistic=pessimistic.tok_s(running, fit),
        speedup_by_running={n: round(model.speedup(n, fit), 3) for n in SPEEDUP_BATCHES},
    )
    return plan, tok_s


def format_speedups(plan: SpecPlan) -> str:
    """``speedup by running requests: 8: 2.3x, 16: 2.2x, ...``."""
    cells = ", ".join(f"{n}: {s:.2f}x" for n, s in plan.speedup_by_running.items())
    return f"speedup over the same batch without speculation, by running requests: {cells}"
