"""What the planner answers for one profile on one rig (``PlanRow``), its evidence and how rows
are ranked; ``planner.py`` computes the rows, ``plan_table.py`` and ``plan_json.py`` show them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from eagledata.capacity.speculative import SpecPlan
from eagledata.profiles.profile import BF16_KV_DTYPES, Profile
from eagledata.profiles.rigs import reference_rig


class PlanRow(BaseModel):
    """One profile's plan on one rig. Token counts are KV slots; rates are generated tok/s; a
    rig that holds several servers of the profile counts them together (``servers``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str
    rig: str = ""
    """The rig planned for (``configs/rigs.toml``)."""
    nodes: int = 1
    """The nodes one server spans (``--nnodes``)."""
    servers: int = 1
    """Servers of this profile on the rig (0: it does not fit the rig's nodes)."""
    gpus: int = 0
    """GPUs the row uses: servers x GPUs of one server."""
    carried_over: bool = False
    """The profile is written for other rigs (its ``rigs``): planned here as it is."""
    kv_cache_dtype: str
    plan_only: bool
    status: str
    parallelism: str
    mem_fraction_static: float
    cell_bytes: int
    attention: str = ""
    """The model's attention as SGLang pools its KV: MLA, MHA, GQA, MQA, + sliding window."""
    kv_gib_per_rank: float
    tokens_per_rank: int
    system_tokens: int
    starts: bool
    concurrent_4k: int
    steady_concurrency: int
    running: int
    rated_running: int = 0
    """The running requests the rate is evaluated at: ``running``, held at the step-time fit's
    ``max_running_fit`` (where decode turns compute-bound), every server counted."""
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
    speculative: SpecPlan | None = None
    """Speculative decoding's settings and arithmetic; None for a plain deployment."""
    evidence: str | None = None
    """measured, arithmetic or unverified (the profile's ``evidence``)."""
    settle: str = ""
    """The one real-rig measurement that would settle the row."""
    sglang_versions: list[str] = []
    """The SGLang releases the profile runs on (a live row: the server's own)."""
    assumptions: list[str] = []
    """Every unverified assumption the row's figures rest on (the profile's own, an acceptance
    length that was not measured, and the rig's: ``rig_assumptions``)."""
    rig_assumptions: list[str] = []
    """Those of ``assumptions`` that are the rig's (how the reference's measurements were carried
    over to it), the same for every row of one rig."""

    @property
    def is_bf16(self) -> bool:
        return self.kv_cache_dtype in BF16_KV_DTYPES


EVIDENCE = ("measured", "arithmetic", "unverified")
"""A row's evidence, strongest first."""


def written_for(profile: Profile) -> list[str]:
    """The rigs a profile is written for (its ``rigs``; by default the reference rig)."""
    return list(profile.rigs) if profile.rigs is not None else [reference_rig().name]


def best_key(row: PlanRow) -> tuple[int, int]:
    """How rows are ranked for "best": the rate (to the token per second), and at an equal rate
    the row resting on fewer assumptions."""
    return round(row.tok_s), -len(row.assumptions)
