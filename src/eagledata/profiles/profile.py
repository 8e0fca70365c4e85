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

``sglang_versions`` lists the SGLang releases the profile runs on; ``[sglang_args]`` is written
once and rendered in each release's spelling (``profiles/releases.py``: ``--cuda-graph-max-bs``
became ``--cuda-graph-max-bs-decode``, ``--enable-dp-attention`` became ``--attn-dp-size``). A
release that lacks one of the profile's flags, or refuses its combination, cannot be listed.

Every launchable profile passes ``--kv-cache-dtype bf16``. A profile with another KV dtype may
exist only as ``plan_only = true`` (a comparison row for ``plan``); ``launch-server`` refuses it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagledata.config import format_validation_error, shipped_path
from eagledata.errors import ConfigError
from eagledata.profiles.releases import (
    Release,
    get_release,
    render_args,
    supported_versions,
    unsupported,
)
from eagledata.profiles.rigs import rig_names

DEFAULT_PROFILES_DIR = Path("configs/profiles")
DEFAULT_PROFILE = "kimi-k25-tp8"
"""The profile ``launch-server`` uses when none is named: plain TP8, tuned, bf16."""
BF16_KV_DTYPES = frozenset({"bf16", "bfloat16"})

ArgValue = str | int | float | bool | list[str | int | float]

_FLAG_KEY = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

# Keys a profile must spell canonically: the planner and the guard read them by these names.
_CANONICAL_KEYS = {
    "model": "model-path",
    "tensor-parallel-size": "tp-size",
    "tp": "tp-size",
    "data-parallel-size": "dp-size",
    "dp": "dp-size",
    "decode-context-parallel-size": "dcp-size",
}
# Keys owned elsewhere or refused outright.
_FORBIDDEN_KEYS = {
    "host": "set [server] host instead",
    "port": "set [server] port instead",
    "config": "a --config YAML file can set the KV cache dtype out of sight; put flags here",
    "quantization-param-path": "KV scaling factors exist only for an fp8 KV cache",
    "attn-dp-size": (
        "write dp-size N with enable-dp-attention = true; launch-server spells it "
        "--attn-dp-size N for the releases that take that"
    ),
    "node-rank": "each node's own: launch-server --node-rank R (write nnodes here)",
    "dist-init-addr": "the first node's address: launch-server --dist-init-addr HOST:PORT",
    "nccl-init-addr": "the first node's address: launch-server --dist-init-addr HOST:PORT",
}


_SPECULATIVE_SHAPE_KEYS = (
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSection(_Strict):
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


class ModelSection(_Strict):
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


class HardwareSection(_Strict):
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


class ThroughputSection(_Strict):
    """Decode step-time fit ``tok/s = N / (step_base_s + step_per_request_s * N)``."""

    step_base_s: Annotated[float, Field(gt=0)] = 0.077
    step_per_request_s: Annotated[float, Field(ge=0)] = 0.00018
    band: Annotated[float, Field(ge=0, lt=1)] = 0.25
    max_running_fit: Annotated[int, Field(gt=0)] = 150
    """The fit holds to about this many running requests; above it compute flattens the curve."""
    max_running_cap: Annotated[int, Field(gt=0)] = 256
    """Never recommend more running requests than this (compute-bound, not KV-bound)."""


class DraftSection(_Strict):
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


class Profile(_Strict):
    """One launch profile. ``name`` and ``source`` are filled in by the loader."""

    name: str
    source: str = ""
    description: str = ""
    status: str = ""
    notes: list[str] = []
    sglang_versions: Annotated[list[str], Field(min_length=1)]
    """The SGLang releases the profile runs on (each a file of ``configs/sglang-releases/``)."""
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
        if isinstance(data, dict) and "sglang_version" in data:
            raise ValueError(
                "sglang_version: now sglang_versions, a list of the releases the profile runs "
                f"on (known: {', '.join(supported_versions())})"
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

    @field_validator("sglang_versions")
    @classmethod
    def _known_releases(cls, versions: list[str]) -> list[str]:
        known = supported_versions()
        for version in versions:
            if version not in known:
                raise ValueError(
                    f"{version!r} is not a release eagledata supports (known: {', '.join(known)})"
                )
        if len(set(versions)) != len(versions):
            raise ValueError("a release is listed twice")
        return versions

    @field_validator("sglang_args")
    @classmethod
    def _check_arg_keys(cls, args: dict[str, ArgValue]) -> dict[str, ArgValue]:
        problems: list[str] = []
        for key, value in args.items():
            if not _FLAG_KEY.match(key):
                problems.append(f"{key!r} is not a flag name (write tp-size, not --tp-size)")
            elif key in _CANONICAL_KEYS:
                problems.append(f"{key!r}: write {_CANONICAL_KEYS[key]!r}")
            elif key in _FORBIDDEN_KEYS:
                problems.append(f"{key!r} is not allowed: {_FORBIDDEN_KEYS[key]}")
            elif value is False:
                problems.append(f"{key!r} = false: delete the key to leave a flag off")
        for key in ("model-path", "kv-cache-dtype", "mem-fraction-static"):
            if key not in args:
                problems.append(f"{key!r} is required")
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
        problems += self._speculative_problems()
        for version in self.sglang_versions:
            release = get_release(version)
            assert release is not None  # checked by _known_releases
            problems += [
                f"sglang_versions: {version}: {why}"
                for why in unsupported(self.sglang_args, release)
            ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _speculative_problems(self) -> list[str]:
        args, problems = self.sglang_args, []
        algorithm = args.get("speculative-algorithm")
        if algorithm is None:
            if self.draft is not None:
                problems.append("[draft] needs sglang_args.speculative-algorithm")
            return problems
        if algorithm not in ("EAGLE3", "EAGLE"):
            problems.append("sglang_args.speculative-algorithm: the planner models EAGLE/EAGLE3")
        if self.draft is None:
            problems.append("speculative-algorithm needs a [draft] table (the planner's facts)")
        elif self.draft.name != args.get("speculative-draft-model-path"):
            problems.append("draft.name must equal sglang_args.speculative-draft-model-path")
        for key in (
            "speculative-num-steps",
            "speculative-eagle-topk",
            "speculative-num-draft-tokens",
        ):
            value = args.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"sglang_args.{key}: set it (a positive integer)")
        if "max-running-requests" not in args:
            problems.append(
                "sglang_args.max-running-requests: set it; SGLang resets it to 48 under "
                "speculative decoding"
            )
        steps, topk = args.get("speculative-num-steps"), args.get("speculative-eagle-topk")
        tokens = args.get("speculative-num-draft-tokens")
        if topk == 1 and isinstance(steps, int) and tokens != steps + 1:
            problems.append(
                "sglang_args.speculative-num-draft-tokens: with top-k 1 SGLang forces it to "
                "num-steps + 1; write that"
            )
        return problems

    # --- what the planner and the launcher read --------------------------------------------

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
                f"profile {self.name} has no form for sglang {version}{why}; it runs on "
                f"{', '.join(self.sglang_versions)}"
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


# --- loading -------------------------------------------------------------------------------


def parse_profile(data: dict[str, Any], *, name: str, source: str = "") -> Profile:
    """Validate a profile's TOML table; problems become one ``ConfigError`` line each."""
    where = source or name
    for reserved in ("name", "source"):
        if reserved in data:
            raise ConfigError(f"{where}: {reserved}: set by the loader, remove it from the file")
    try:
        return Profile.model_validate({**data, "name": name, "source": source})
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, f"{where}: ")) from None


def default_profiles_dir() -> Path:
    """``./configs/profiles`` when the working directory has one, else the shipped profiles."""
    if DEFAULT_PROFILES_DIR.is_dir():
        return DEFAULT_PROFILES_DIR
    return shipped_path(DEFAULT_PROFILES_DIR.as_posix()) or DEFAULT_PROFILES_DIR


def list_profiles(profiles_dir: str | Path | None = None) -> list[str]:
    """Names of the profiles in ``profiles_dir`` (default ``default_profiles_dir()``), sorted."""
    directory = Path(profiles_dir) if profiles_dir is not None else default_profiles_dir()
    if not directory.is_dir():
        return []
    return sorted(path.stem for path in directory.glob("*.toml"))


def load_profile(name_or_path: str | Path, profiles_dir: str | Path | None = None) -> Profile:
    """Load a profile by name from ``profiles_dir``, or from a ``.toml`` path."""
    directory = Path(profiles_dir) if profiles_dir is not None else default_profiles_dir()
    candidate = Path(name_or_path)
    path = candidate if candidate.suffix == ".toml" else directory / f"{name_or_path}.toml"
    if not path.is_file():
        available = ", ".join(list_profiles(directory)) or "none"
        raise ConfigError(
            f"profile: unknown profile {str(name_or_path)!r} in {directory} "
            f"(available: {available})"
        )
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    return parse_profile(data, name=path.stem, source=str(path))


def load_profiles(
    names: Sequence[str] | None = None, profiles_dir: str | Path | None = None
) -> list[Profile]:
    """The named profiles, or every profile in the directory when ``names`` is None."""
    wanted = list(names) if names is not None else list_profiles(profiles_dir)
    return [load_profile(name, profiles_dir) for name in wanted]
