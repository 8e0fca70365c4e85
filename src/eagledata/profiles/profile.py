"""Launch profiles: one TOML file per SGLang server configuration, in ``configs/profiles/``.

A profile holds three things, so the command that is launched and the numbers that are planned
can never drift apart:

* ``[sglang_args]``: the exact ``launch_server`` flags, in file order (``true`` is a bare flag);
  ``[server]`` adds ``--host``/``--port``. The planner reads tp/dp/dcp/mem fraction from the same
  table.
* ``[model]``: the facts the capacity planner needs of the model (its KV cell shape, what one GPU
  holds once the weights load at a given TP size, the extra replicated weights under DP
  attention). The GPUs are not the profile's: ``configs/rigs.toml`` holds them, and ``plan
  --rig NAME`` puts every profile on that rig (``rigs`` limits a profile tuned for some rigs to
  those).
* ``[throughput]``: the empirical step-time fit on the reference rig (defaults: its two runs);
  the planner carries it over to another rig.

A server over several nodes says ``nnodes`` in ``[sglang_args]``; which node a command is for
(``--node-rank``, ``--dist-init-addr``) is ``launch-server``'s to add, never the profile's.

``min_release`` names the oldest SGLang release the profile runs on; it runs on every supported
release from it on (the list is ``configs/sglang-releases/``, one file a release, and
``sglang_versions`` reads it). ``[sglang_args]`` is written once and rendered in each release's
spelling (``profiles/releases.py``: ``--cuda-graph-max-bs`` became ``--cuda-graph-max-bs-decode``,
``--enable-dp-attention`` became ``--attn-dp-size``). A release from ``min_release`` on that
lacks one of the profile's flags, or refuses its combination, is an error naming the release the
flags need.

Every launchable profile passes ``--kv-cache-dtype bf16``. A profile with another KV dtype may
exist only as ``plan_only = true`` (a comparison row for ``plan``); ``launch-server`` refuses it.

This module holds ``Profile`` (its checks, what the planner and the launcher read of it, its
flags rendered for a release) and ``NodeRank``; the tables beside the flags are
``profiles/sections.py``'s, the rules of ``[sglang_args]`` ``profiles/sglang_args.py``'s, and
finding and reading the files ``profiles/loading.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from eagledata.errors import ConfigError
from eagledata.profiles.releases import (
    Release,
    get_release,
    oldest_form,
    releases_from,
    render_args,
    supported_versions,
    unsupported,
    version_key,
)
from eagledata.profiles.rigs import rig_names
from eagledata.profiles.sections import DraftSection, ModelSection, ServerSection

# capacity/ reads these with the profiles it plans: named here too
from eagledata.profiles.sections import HardwareSection as HardwareSection
from eagledata.profiles.sections import ThroughputSection as ThroughputSection
from eagledata.profiles.sglang_args import ArgValue, arg_key_problems, speculative_problems

BF16_KV_DTYPES = frozenset({"bf16", "bfloat16"})


class Profile(BaseModel):
    """One launch profile. ``name`` and ``source`` are filled in by the loader."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # as each of its tables (sections)

    name: str
    source: str = ""
    description: str = ""
    status: str = ""
    notes: list[str] = []
    min_release: str
    """The oldest SGLang release the profile runs on (a file of ``configs/sglang-releases/``);
    it runs on every supported release from it on (``sglang_versions``)."""
    plan_only: bool = False
    server: ServerSection = ServerSection()
    sglang_args: dict[str, ArgValue]
    model: ModelSection
    throughput: ThroughputSection = ThroughputSection()
    draft: DraftSection | None = None
    """Present exactly when ``sglang_args`` turns speculative decoding on."""
    evidence: Literal["measured", "arithmetic", "unverified"] | None = None
    """How much of the row is known: measured on the rig, arithmetic on measured inputs, or
    resting on something never run."""
    settle: str = ""
    """The one measurement on a real rig that would settle this profile's row."""
    assumptions: list[str] = []
    """What the row rests on that was never run (the plan names each one in the row)."""
    rigs: list[str] | None = None
    """The rigs the profile is written for (``configs/rigs.toml``): ``plan --rig NAME`` shows it
    on those (``--profile`` plans it on any). None: the reference rig."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        for old in ("sglang_version", "sglang_versions"):
            if isinstance(data, dict) and old in data:
                listed = data[old] if isinstance(data[old], list) else [data[old]]
                oldest = min((str(v) for v in listed), key=version_key, default="0.5.9")
                raise ValueError(
                    f"{old}: now min_release, the oldest release the profile runs on (it runs "
                    f'on every supported release from it on): write min_release = "{oldest}" '
                    f"(supported: {', '.join(supported_versions())})"
                )
        if isinstance(data, dict) and "hardware" in data:
            raise ValueError(
                "[hardware]: the GPUs now live in configs/rigs.toml (plan --rig NAME); what the "
                "model holds per GPU is [model] resident_gib, replicated_gib and "
                "dp_attention_extra_gib"
            )
        return data

    @field_validator("rigs")
    @classmethod
    def _known_rigs(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        known = rig_names()
        for name in names:
            if name not in known:
                raise ValueError(f"{name!r} is not a rig of configs/rigs.toml ({', '.join(known)})")
        if not names:
            raise ValueError("list at least one rig, or leave rigs out (the reference rig)")
        return names

    @field_validator("min_release")
    @classmethod
    def _known_release(cls, version: str) -> str:
        known = supported_versions()
        if version not in known:
            raise ValueError(
                f"{version!r} is not a release eagledata supports (known: {', '.join(known)})"
            )
        return version

    @field_validator("sglang_args")
    @classmethod
    def _check_arg_keys(cls, args: dict[str, ArgValue]) -> dict[str, ArgValue]:
        problems = arg_key_problems(args)
        if problems:
            raise ValueError("; ".join(problems))
        return args

    @model_validator(mode="after")
    def _check_consistency(self) -> Profile:
        args = self.sglang_args
        problems: list[str] = []
        dtype = args.get("kv-cache-dtype")
        if not self.plan_only and dtype not in BF16_KV_DTYPES:
            problems.append(
                f"sglang_args.kv-cache-dtype is {dtype!r}: a launchable profile must pass bf16 "
                "(fp8 degraded Kimi-K2.5 and poisons drafter data); keep other dtypes only with "
                "plan_only = true"
            )
        for key in ("tp-size", "dp-size", "dcp-size", "nnodes"):
            value = args.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"sglang_args.{key}: must be a positive integer")
        mfs = args.get("mem-fraction-static")
        if isinstance(mfs, bool) or not isinstance(mfs, int | float) or not 0 < mfs < 1:
            problems.append("sglang_args.mem-fraction-static: must be a number in (0, 1)")
        flag = args.get("enable-dp-attention", False)
        if flag is not False and flag is not True:
            problems.append("sglang_args.enable-dp-attention: must be true or absent")
        if not problems:
            tp, dp, dcp = self.tp_size, self.dp_size, self.dcp_size
            if self.enable_dp_attention and (dp < 2 or tp % dp):
                problems.append(
                    f"sglang_args.dp-size: DP attention needs dp-size > 1 dividing tp-size {tp}"
                )
            if tp % dcp:
                problems.append(f"sglang_args.dcp-size: {dcp} must divide tp-size {tp}")
            if self.gpus % self.nnodes:
                problems.append(
                    f"sglang_args.nnodes: {self.nnodes} nodes cannot share {self.gpus} GPUs evenly"
                )
            if self.enable_dp_attention and dp not in self.model.dp_attention_extra_gib:
                problems.append(
                    f"model.dp_attention_extra_gib: no entry for dp {dp} (the extra attention "
                    "and embedding weights each GPU holds under DP attention)"
                )
        problems += speculative_problems(self.sglang_args, self.draft)
        problems += self._release_problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _release_problems(self) -> list[str]:
        """Each release from ``min_release`` on that has no form of the flags, and the fix: the
        release they need."""
        problems = [
            f"min_release: sglang {release.version}: {why}"
            for release in releases_from(self.min_release)
            for why in unsupported(self.sglang_args, release)
        ]
        if problems:
            needed = oldest_form(self.sglang_args)
            problems.append(
                f'these flags need SGLang >= {needed.version}: set min_release = "{needed.version}"'
                if needed is not None
                else "no supported release has a form of these flags"
            )
        return problems

    # --- what the planner and the launcher read --------------------------------------------

    @property
    def sglang_versions(self) -> list[str]:
        """Every supported release the profile runs on: ``min_release`` and those after it."""
        return [release.version for release in releases_from(self.min_release)]

    @property
    def kv_cache_dtype(self) -> str:
        return str(self.sglang_args["kv-cache-dtype"])

    @property
    def model_path(self) -> str:
        return str(self.sglang_args["model-path"])

    @property
    def mem_fraction_static(self) -> float:
        return float(self._number("mem-fraction-static", 0.0))

    @property
    def tp_size(self) -> int:
        return int(self._number("tp-size", 1))

    @property
    def dp_size(self) -> int:
        return int(self._number("dp-size", 1))

    @property
    def dcp_size(self) -> int:
        return int(self._number("dcp-size", 1))

    @property
    def enable_dp_attention(self) -> bool:
        return self.sglang_args.get("enable-dp-attention") is True

    @property
    def nnodes(self) -> int:
        """The nodes one server spans (``--nnodes``; 1 when unset)."""
        return int(self._number("nnodes", 1))

    @property
    def gpus(self) -> int:
        """The GPUs one server uses: TP ranks, times DP replicas unless DP is attention's."""
        return self.tp_size * (1 if self.enable_dp_attention else self.dp_size)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nnodes

    @property
    def max_running_requests(self) -> int | None:
        value = self.sglang_args.get("max-running-requests")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def context_length(self) -> int | None:
        value = self.sglang_args.get("context-length")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def cuda_graph_max_bs(self) -> int | None:
        for key in ("cuda-graph-max-bs-decode", "cuda-graph-max-bs"):
            value = self.sglang_args.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    @property
    def speculative_algorithm(self) -> str | None:
        value = self.sglang_args.get("speculative-algorithm")
        return str(value) if value is not None else None

    def _number(self, key: str, default: float) -> float:
        value = self.sglang_args.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return default
        return value

    def release(self, version: str) -> Release:
        """The release ``version`` if the profile runs on it; else ``ConfigError``, one line
        naming the releases it does run on."""
        release = get_release(version) if version in self.sglang_versions else None
        if release is None:
            why = ""
            known = get_release(version)
            if known is not None:
                reasons = unsupported(self.sglang_args, known)
                why = f" ({reasons[0]})" if reasons else ""
            elif version not in supported_versions():
                why = " (not a release eagledata knows)"
            raise ConfigError(
                f"profile {self.name} has no form for sglang {version}{why}; it needs SGLang "
                f">= {self.min_release}; it runs on {', '.join(self.sglang_versions)}"
            )
        return release

    @property
    def newest_version(self) -> str:
        return max(self.sglang_versions, key=lambda v: self.release(v).key)

    def server_argv(self, version: str, node: NodeRank | None = None) -> list[str]:
        """The ``launch_server`` arguments this profile means on sglang ``version``, in file
        order, then the node's place (a multi-node profile), host/port last."""
        return self.render(self.release(version), node)

    def render(self, release: Release, node: NodeRank | None = None) -> list[str]:
        """The arguments in ``release``'s spelling, whether or not the profile runs on it
        (the tests show such a release refusing them); a multi-node profile's ``node`` adds
        ``--node-rank R --dist-init-addr HOST:PORT``."""
        argv: list[str] = []
        for key, value in render_args(self.sglang_args, release):
            flag = f"--{key}"
            if value is True:
                argv.append(flag)
            elif isinstance(value, list):
                argv += [flag, *(_format_value(v) for v in value)]
            else:
                argv += [flag, _format_value(value)]
        if node is not None:
            argv += ["--node-rank", str(node.rank), "--dist-init-addr", node.dist_init_addr]
        argv += ["--host", self.server.host, "--port", str(self.server.port)]
        return argv

    def node(self, rank: int | None, dist_init_addr: str | None) -> NodeRank | None:
        """Which node of a multi-node server a command is for; None for a one-node profile.
        ``ConfigError``, one line naming the fix, when the two are missing, out of range or
        given to a one-node profile."""
        if self.nnodes == 1:
            if rank is not None or dist_init_addr is not None:
                raise ConfigError(
                    f"profile {self.name} runs on one node: drop --node-rank and "
                    "--dist-init-addr (they are for a profile with nnodes > 1)"
                )
            return None
        given = (("--node-rank R", rank), ("--dist-init-addr HOST:PORT", dist_init_addr))
        missing = [flag for flag, value in given if value is None]
        if missing:
            raise ConfigError(
                f"profile {self.name} spans {self.nnodes} nodes: pass {' and '.join(missing)} "
                f"(R from 0 to {self.nnodes - 1} on each node; HOST:PORT the node-rank-0 "
                "node's address, the same on every node)"
            )
        assert rank is not None and dist_init_addr is not None
        if not 0 <= rank < self.nnodes:
            raise ConfigError(
                f"--node-rank {rank}: profile {self.name} spans {self.nnodes} nodes, so 0 to "
                f"{self.nnodes - 1}"
            )
        host, _, port = dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"--dist-init-addr {dist_init_addr!r}: write HOST:PORT, the node-rank-0 node's "
                "address and a free port (e.g. 10.0.0.1:50000)"
            )
        return NodeRank(rank, dist_init_addr)


@dataclass(frozen=True)
class NodeRank:
    """Which node of a multi-node server a launch command is for."""

    rank: int
    dist_init_addr: str
    """``HOST:PORT`` of node rank 0, where every node meets (``--dist-init-addr``)."""

    @property
    def serves_http(self) -> bool:
        """Only node rank 0 runs the tokenizer and the HTTP API; the others run their ranks'
        schedulers (SGLang's ``Engine._launch_subprocesses``)."""
        return self.rank == 0

    @property
    def head_host(self) -> str:
        return self.dist_init_addr.rpartition(":")[0]


def _format_value(value: str | int | float | bool) -> str:
    # repr keeps a float exact and short: 0.9 -> "0.9", 1e-05 -> "1e-05"
    return repr(value) if isinstance(value, float) else str(value)
