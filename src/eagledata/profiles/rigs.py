"""The rigs eagledata plans for: ``configs/rigs.toml`` (``eagledata plan --rig NAME``).

A rig is GPUs: the GPU model, its memory, how many per node, how many nodes, how they talk, and
the two figures that carry the reference rig's step-time fit over to it (memory bandwidth, bf16
arithmetic). The profiles say what to launch and what the model holds per GPU; the planner puts
a profile on a rig (``capacity/placement.py``). One file holds every rig, so a GPU's facts are
written once.
"""

from __future__ import annotations

import tomllib
from functools import cache
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from eagledata.config import format_validation_error, shipped_path
from eagledata.errors import ConfigError

RIGS_FILE = "configs/rigs.toml"
MIB_PER_GIB = 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rig(_Strict):
    """One rig of ``configs/rigs.toml``; ``name`` is filled in by the loader."""

    name: str = ""
    description: str = ""
    gpu: str
    gpu_memory_mib: Annotated[int, Field(gt=0)]
    """Per GPU, as ``nvidia-smi`` reports it."""
    gpus_per_node: Annotated[int, Field(gt=0)]
    nodes: Annotated[int, Field(gt=0)] = 1
    interconnect: str
    memory_bandwidth_tbs: Annotated[float, Field(gt=0)]
    bf16_tflops: Annotated[float, Field(gt=0)]
    """Dense bf16 arithmetic per GPU."""
    pre_free_gib: Annotated[float, Field(gt=0)]
    """Free memory per GPU before the weights load, as SGLang's pool sizing measures it."""
    evidence: Literal["measured", "arithmetic", "unverified"]
    sources: str = ""
    assumptions: list[str] = []
    """What the rig's own facts rest on that was never measured on it."""

    @model_validator(mode="after")
    def _free_below_total(self) -> Rig:
        if self.pre_free_gib >= self.gpu_memory_gib:
            raise ValueError(
                f"pre_free_gib {self.pre_free_gib} must be below the GPU's "
                f"{self.gpu_memory_gib:.2f} GiB"
            )
        return self

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu_memory_mib / MIB_PER_GIB

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def summary(self) -> str:
        """``8x H200 SXM 141GB HBM3e (140.40 GiB), 1 node, NVLink 4 ...``."""
        nodes = f"{self.nodes} nodes of {self.gpus_per_node}" if self.nodes > 1 else "1 node"
        return (
            f"{self.gpus}x {self.gpu} ({self.gpu_memory_gib:.2f} GiB each), {nodes}; "
            f"{self.interconnect}"
        )


class RigsFile(_Strict):
    reference: str
    rigs: dict[str, Rig]

    @model_validator(mode="after")
    def _reference_is_a_rig(self) -> RigsFile:
        if self.reference not in self.rigs:
            raise ValueError(f"reference: {self.reference!r} is not one of the rigs")
        return self


@cache
def _rigs_file() -> RigsFile:
    path = shipped_path(RIGS_FILE)
    if path is None or not path.is_file():
        raise ConfigError(f"{RIGS_FILE}: not found; the installation is incomplete")
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read the rigs file: {error}") from None
    try:
        parsed = RigsFile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, f"{path}: ")) from None
    named = {name: rig.model_copy(update={"name": name}) for name, rig in parsed.rigs.items()}
    return parsed.model_copy(update={"rigs": named})


def rigs() -> dict[str, Rig]:
    """Every rig, in file order."""
    return dict(_rigs_file().rigs)


def rig_names() -> list[str]:
    return list(_rigs_file().rigs)


def reference_rig() -> Rig:
    """The rig the step-time fit and the memory fit were measured on."""
    found = _rigs_file()
    return found.rigs[found.reference]


def get_rig(name: str) -> Rig:
    """The rig called ``name``; ``ConfigError`` naming the known ones otherwise."""
    found = _rigs_file().rigs.get(name)
    if found is None:
        raise ConfigError(
            f"--rig: unknown rig {name!r} (known: {', '.join(rig_names())}; they live in "
            f"{RIGS_FILE})"
        )
    return found
