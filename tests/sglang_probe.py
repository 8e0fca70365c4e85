"""Ask one real SGLang release, by its own code, about what eagledata sends it and reads back.

Runs inside the SGLang test venv (``tests/sglangkit.py`` builds it), never in the project's:

    VENV/bin/python tests/sglang_probe.py --release-dir DIR --out report.json < job.json

DIR holds one release installed ``--no-deps --target`` with the packages it pins differently;
the venv holds torch (the CPU build) and the light packages the imports need. The job (JSON on
stdin) says what to check; the report (JSON, ``--out``) says what the release made of it:

``argv``     ``{name: [launch argv]}``: each parsed by ``ServerArgs.add_cli_args`` exactly as
             ``prepare_server_args`` builds the parser (an argparse error is the release's
             refusal), the record built without GPU probing, then the resolution steps that need
             neither a GPU nor the model's checkpoint run one by one on an emulated CUDA platform
             (0.5.9 / 0.5.15.post1: ``ServerArgs._handle_*``; 0.5.23: the pipeline's hooks under
             its own ``override_platform(is_cuda=True)``). Reported: the parse (ok, error, the
             warnings it logged: deprecations), every step (ok, error, skipped and why), the
             resolved layout, and the fields ``/server_info`` would show.
``bodies``   ``{name: /generate body}``: what ``/generate`` does with it before any tokenizer or
             GPU work: 0.5.23's JSON contract (``entrypoints/api_contract.py``), FastAPI's parse
             into ``GenerateReqInput`` (``pydantic.TypeAdapter``; top-level keys it does not know
             are dropped silently: reported), ``normalize_batch_and_arguments()``, then
             ``SamplingParams(**params).normalize(None).verify(vocab_size)``; and the DP rank the
             request ends up pinned to.
``metrics``  true: the ``/metrics`` names the release's own ``SchedulerMetricsCollector`` and
             ``TokenizerMetricsCollector`` register (family and sample names).
``kv_flags`` true: every option of the parser that sets a KV cache dtype, its choices, and the
             shortest prefix argparse takes for it.
``kv_cells`` ``{name: {config, tp, dcp, swa_full_tokens_ratio}}`` (0.5.23): one token's KV cell in
             bytes on one rank, by the release's own arithmetic: its ``ModelConfig`` reads the
             ``config.json`` (its ``quantization_config`` left out: the weights' format does not
             shape the KV cell, and the CPU build registers no mxfp4), its
             ``resolve_layer_indices`` counts the layers, and its pool configurator sizes the
             cell (``DefaultPoolConfigurator._compute_cell_size``, or a
             ``HybridSWAPoolConfigurator`` for a sliding-window hybrid) in bf16. What a running
             server would publish (the parallel layout, the schedule and memory settings) and the
             KV-cache configurator's own inputs are stand-ins holding only the fields the sizing
             reads; the arithmetic is the release's.

Modules that cannot be imported on a CPU machine are stubbed, and only these four (each found by
a real ImportError in one of the three releases):

* ``triton`` (GPU kernel compiler; ``import triton`` unguarded in ``sglang/srt/utils/common.py``;
  the CPU torch build ships without it),
* ``torchvision`` (PyPI's does not import beside the CPU torch 2.13.0; unguarded in 0.5.15.post1's
  ``utils/common.py``, and transformers 5.12.1 needs it present),
* ``IPython`` (notebook helpers, unguarded in ``sglang/utils.py``),
* ``sgl_kernel`` (GPU kernels; 0.5.9's ``mem_cache/memory_pool_host.py``, reached by
  ``managers/io_struct``), served to ``sglang/srt/mem_cache/`` only.

A stub answers any attribute with a permissive class (a decorator, a base class, a type); it is
served only to importers inside the release folder, and hidden stubs are invisible to
``importlib.util.find_spec``, so code asking "is X installed?" hears "no" as on a CPU machine.
Standard library only, plus the release (and pydantic, prometheus_client from the venv).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import logging
import os
import re
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# --- stubs ------------------------------------------------------------------------------------

# name -> (visible to find_spec, importer path prefixes served (None: any file of the release))
STUBS: dict[str, tuple[bool, tuple[str, ...] | None]] = {
    "triton": (False, None),
    "IPython": (False, None),
    "torchvision": (True, None),
    "sgl_kernel": (False, ("sglang/srt/mem_cache/",)),
}


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            raise RuntimeError("stubbed GPU-only module: no device on this machine")
        decorated = args[0] if len(args) == 1 and not kwargs else None
        if callable(decorated) and not isinstance(decorated, _StubMeta):
            return decorated  # used as a decorator
        return cls

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __iter__(cls) -> Iterator[Any]:
        return iter(())


def _stub_class(name: str) -> type:
    return _StubMeta(name, (), {"__module__": "stub"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(self, name, value)
        return value


RELEASE: list[str] = []  # the release folder, set by install_stubs


def in_release(path: str) -> bool:
    return bool(RELEASE) and os.path.abspath(path).startswith(RELEASE[0])


def short(path: str) -> str:
    """A file of the release relative to its folder (``sglang/...``)."""
    return os.path.abspath(path)[len(RELEASE[0]) :] if in_release(path) else path


def _importer() -> str:
    frame: types.FrameType | None = sys._getframe(2)
    here = os.path.abspath(__file__)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen") or "importlib" in name or os.path.abspath(name) == here):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.hidden = {name for name, (visible, _) in STUBS.items() if not visible}
        self.served: dict[str, str] = {}  # module -> first importer

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        root = fullname.split(".")[0]
        if root not in STUBS:
            return None
        importer = _importer()
        scope = STUBS[root][1]
        if not in_release(importer) or (
            scope is not None and not short(importer).startswith(scope)
        ):
            return None  # the other finders fail: ImportError, as without the stub
        self.served.setdefault(fullname, short(importer))
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        if "." not in spec.name:
            module.__dict__["__version__"] = "0.0.0+stub"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_stubs(release_dir: Path) -> StubFinder:
    # torch asks `import triton` once and caches the answer: let it hear "no" before a stub exists
    for prime in ("torch.utils._triton", "torch._inductor.runtime.triton_compat"):
        try:
            module = importlib.import_module(prime)
            if hasattr(module, "has_triton_package"):
                module.has_triton_package()
        except Exception:  # torch reorganised: nothing to prime
            pass
    finder = StubFinder()
    RELEASE[:] = [str(release_dir.resolve()) + os.sep]
    sys.meta_path.insert(0, finder)
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        full = importlib.util.resolve_name(name, package) if name.startswith(".") else name
        if full.split(".")[0] in finder.hidden:
            return None
        return real_find_spec(name, package)

    importlib.util.find_spec = find_spec  # type: ignore[assignment]
    return finder


# --- what the release logs --------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.messages.append(_ANSI.sub("", message).strip())


@contextlib.contextmanager
def captured(out: dict[str, Any]) -> Iterator[None]:
    """Collect into ``out``: log records of WARNING and up (``warnings``: SGLang reports
    deprecated flags and resolution notes through logging), ``warnings.warn`` calls
    (``python_warnings``) and stderr."""
    records = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(min(level or logging.WARNING, logging.WARNING))
    stdout, stderr = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                yield
        finally:
            root.removeHandler(records)
            root.setLevel(level)
            out["warnings"] = records.messages
            out["python_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
            out["stderr"] = _ANSI.sub("", stderr.getvalue()).strip()[-4000:]


def error_text(exc: BaseException) -> str:
    """``Type: message (at file:line)``, the line the innermost frame of the release."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if in_release(frame.filename):
            where = f" (at {short(frame.filename)}:{frame.lineno})"
            break
    return f"{type(exc).__name__}: {exc}{where}"


def plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return repr(value)


# --- launch argv: parse and the GPU-free resolution --------------------------------------------


class ModelConfigNeeded(Exception):
    """Raised instead of loading the model's HF config (the checkpoint is not here)."""


def _refuse_model_config(*args: Any, **kwargs: Any) -> Any:
    raise ModelConfigNeeded(f"reads the model's HF config ({short(_importer())})")


@contextlib.contextmanager
def no_model_config(server_args_cls: type) -> Iterator[None]:
    """Every way a resolution step loads the model's config raises ``ModelConfigNeeded``:
    ``ServerArgs.get_model_config`` (0.5.9, 0.5.15.post1) and ``model_config_of`` (0.5.15.post1's
    and 0.5.23's arg_groups, bound by name into each module that imports it)."""
    saved: list[tuple[Any, str, Any]] = []
    if "get_model_config" in server_args_cls.__dict__:
        saved.append(
            (server_args_cls, "get_model_config", server_args_cls.__dict__["get_model_config"])
        )
        server_args_cls.get_model_config = _refuse_model_config  # type: ignore[attr-defined]
    originals = set()
    for name in ("sglang.srt.arg_groups.model_override_base", "sglang.srt.arg_groups.overrides"):
        module = sys.modules.get(name)
        if module is not None and callable(getattr(module, "model_config_of", None)):
            originals.add(module.model_config_of)
    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("sglang.")
            and getattr(module, "model_config_of", None) in originals
        ):
            saved.append((module, "model_config_of", module.model_config_of))
            module.__dict__["model_config_of"] = _refuse_model_config
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


@contextlib.contextmanager
def legacy_cuda(server_args_module: types.ModuleType) -> Iterator[None]:
    """0.5.9 / 0.5.15.post1: the handlers call is_cuda()/is_hip()/... imported into server_args."""
    answers = {"is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False,
               "is_hpu": False, "is_cpu": False, "is_musa": False, "is_mps": False}  # fmt: skip
    saved = {}
    for name, answer in answers.items():
        if callable(getattr(server_args_module, name, None)):
            saved[name] = getattr(server_args_module, name)
            setattr(server_args_module, name, lambda _a=answer: _a)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(server_args_module, name, fn)


# 0.5.9 / 0.5.15.post1: the ServerArgs methods __post_init__ calls that need neither the GPU
# (_handle_missing_default_values calls get_device()) nor the model's config, in its order.
LEGACY_STEPS = (
    "_handle_deprecated_args",
    "_handle_legacy_cp_arguments",  # 0.5.15.post1
    "_handle_dcp_validation",  # 0.5.15.post1: refuses speculative decoding with DCP on CUDA
    "_handle_cuda_graph_config",  # 0.5.15.post1
    "_handle_data_parallelism",
    "_handle_context_parallelism",  # 0.5.9; later releases read the model config here
)
# 0.5.23: the resolution hooks of the same kind, in run_resolution_pipeline's order.
PIPELINE_STEPS = (
    ("sglang.srt.arg_groups.parallel_hook", "handle_deprecated_dp_attention"),
    ("sglang.srt.arg_groups.serving_hook", "handle_deprecated_args"),
    ("sglang.srt.arg_groups.parallel_hook", "handle_decode_context_parallelism"),
    ("sglang.srt.arg_groups.cuda_graph_hook", "handle_cuda_graph_config"),
    ("sglang.srt.arg_groups.parallel_hook", "handle_data_parallelism"),
    ("sglang.srt.arg_groups.parallel_hook", "handle_context_parallelism"),
)
RESOLVED = ("tp_size", "dp_size", "attn_dp_size", "enable_dp_attention", "dcp_size",
            "chunked_prefill_size", "max_running_requests", "kv_cache_dtype",
            "speculative_algorithm", "speculative_num_draft_tokens")  # fmt: skip
SERVER_INFO = ("model_path", "tp_size", "nnodes", "node_rank", "dist_init_addr", "dp_size",
               "attn_dp_size", "enable_dp_attention", "dcp_size", "kv_cache_dtype",
               "context_length", "max_running_requests",
               "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
               "speculative_eagle_topk", "speculative_num_draft_tokens",
               "speculative_accept_threshold_single", "speculative_accept_threshold_acc",
               "speculative_draft_kv_cache_dtype")  # fmt: skip


def _needs_chunked_prefill(name: str, read: Callable[[str], Any]) -> str | None:
    if "data_parallelism" in name and read("chunked_prefill_size") is None:
        return "chunked_prefill_size is unset: only the GPU-memory step (a GPU) fills it"
    return None


def _run_step(entry: dict[str, Any], call: Callable[[], None], ctx: Any) -> None:
    started = time.perf_counter()
    with captured(entry), ctx:
        try:
            call()
            entry["ok"] = True
        except ModelConfigNeeded as exc:
            entry.update(ok=None, skipped=str(exc))
        except ImportError as exc:  # the model-layer stack: kernels, quantization libraries
            entry.update(ok=None, skipped=f"imports what this machine lacks: {error_text(exc)}")
        except Exception as exc:
            entry.update(ok=False, error=error_text(exc))
    entry["seconds"] = round(time.perf_counter() - started, 2)


def legacy_steps(sa: Any, module: types.ModuleType) -> tuple[list[dict[str, Any]], Callable]:
    def read(field: str) -> Any:
        resolved = getattr(sa, "_resolved", None)
        if callable(resolved):  # 0.5.15.post1 stashes part of its resolution as declarations
            with contextlib.suppress(AttributeError):
                return getattr(resolved(), field)
        return getattr(sa, field)

    steps = []
    for name in LEGACY_STEPS:
        if getattr(type(sa), name, None) is None:
            continue
        entry: dict[str, Any] = {"name": f"ServerArgs.{name}"}
        if (why := _needs_chunked_prefill(name, read)) is not None:
            entry.update(ok=None, skipped=why)
        else:
            ctx = contextlib.ExitStack()
            ctx.enter_context(legacy_cuda(module))
            ctx.enter_context(no_model_config(type(sa)))
            _run_step(entry, getattr(sa, name), ctx)
        steps.append(entry)
    return steps, read


def pipeline_steps(sa: Any) -> tuple[list[dict[str, Any]], Callable]:
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.runtime_context import override_platform

    # what run_resolution_pipeline sets up before its first hook
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = list(getattr(sa, "_resolved_overrides", ()) or ())

    def read(field: str) -> Any:
        return resolution_result(sa, field)

    steps = []
    for module_name, fn_name in PIPELINE_STEPS:
        entry: dict[str, Any] = {"name": f"{module_name.rsplit('.', 1)[-1]}.{fn_name}"}
        fn = getattr(importlib.import_module(module_name), fn_name, None)
        if fn is None:
            continue
        if (why := _needs_chunked_prefill(fn_name, read)) is not None:
            entry.update(ok=None, skipped=why)
        else:
            ctx = contextlib.ExitStack()
            ctx.enter_context(override_platform(is_cuda=True))
            ctx.enter_context(no_model_config(type(sa)))
            _run_step(entry, lambda fn=fn: run_hook(fn, sa), ctx)
        steps.append(entry)
    return steps, read


def new_parser(server_args_cls: type) -> argparse.ArgumentParser:
    """The parser as ``prepare_server_args`` builds it."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_cls.add_cli_args(parser)
    return parser


def check_argv(module: types.ModuleType, argv: list[str]) -> dict[str, Any]:
    server_args_cls = module.ServerArgs
    report: dict[str, Any] = {"argv": argv}
    parse: dict[str, Any] = {}
    report["parse"] = parse
    namespace = None
    with captured(parse):
        parser = new_parser(server_args_cls)
        try:
            namespace = parser.parse_args(argv)
            parse["ok"] = True
        except SystemExit:
            parse["ok"] = False
    if namespace is None:
        errors = [line for line in parse["stderr"].splitlines() if ": error: " in line]
        parse["error"] = errors[-1].split(": error: ", 1)[1] if errors else parse["stderr"]
        return report
    if "--radix-eviction-policy" in inspect.getsource(module.prepare_server_args):
        namespace._radix_eviction_policy_explicitly_set = False  # 0.5.23's prepare_server_args

    pipeline = hasattr(server_args_cls, "resolve_once")  # 0.5.23: __post_init__ resolves nothing
    saved = server_args_cls.__dict__.get("__post_init__")
    try:
        if not pipeline and saved is not None:
            server_args_cls.__post_init__ = lambda self: None  # it calls get_device(): no GPU
        sa = server_args_cls.from_cli_args(namespace)
    except Exception as exc:
        report["construct"] = {"ok": False, "error": error_text(exc)}
        return report
    finally:
        if saved is not None:
            server_args_cls.__post_init__ = saved
    steps, read = pipeline_steps(sa) if pipeline else legacy_steps(sa, module)
    report["steps"] = steps
    resolved = {}
    for field in RESOLVED:
        with contextlib.suppress(AttributeError):
            resolved[field] = plain(read(field))
    report["resolved"] = resolved
    if pipeline:  # /server_info: build_server_info = server_args.resolved_dict() + ...
        full = sa.resolved_dict()
        report["server_info"] = {k: plain(full[k]) for k in SERVER_INFO if k in full}
    else:  # /server_info: dataclasses.asdict(server_args) after __post_init__
        info = {}
        for field in SERVER_INFO:
            with contextlib.suppress(AttributeError):
                info[field] = plain(read(field))
        report["server_info"] = info
    return report


def kv_flags(module: types.ModuleType) -> dict[str, Any]:
    """Every option setting a KV cache dtype: its spellings, choices, and for each spelling the
    shortest prefix argparse reads as it (``allow_abbrev``: a prefix shared by no other option)."""
    parser = new_parser(module.ServerArgs)
    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    found: dict[str, Any] = {}
    for action in parser._actions:
        if not action.dest.endswith("kv_cache_dtype"):
            continue
        spellings = [s for s in action.option_strings if s.startswith("--")]
        shortest = {}
        for spelling in spellings:
            for length in range(3, len(spelling) + 1):
                prefix = spelling[:length]
                owners = {a.dest for a in parser._actions for s in a.option_strings
                          if s.startswith(prefix) and s.startswith("--")}  # fmt: skip
                if owners == {action.dest}:
                    shortest[spelling] = prefix
                    break
        found[action.dest] = {
            "options": spellings,
            "choices": plain(list(action.choices or [])),
            "shortest_prefix": shortest,
        }
    return {"dests": found, "options": sorted(set(options))}


# --- /generate bodies ---------------------------------------------------------------------------


def check_bodies(bodies: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    from pydantic import TypeAdapter
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    try:
        contract = importlib.import_module("sglang.srt.entrypoints.api_contract")
        contract_error = contract.generate_contract_error
    except ImportError:  # before 0.5.23 no JSON contract runs first
        contract_error = None
    fields = {f.name for f in dataclasses.fields(GenerateReqInput)}
    adapter = TypeAdapter(GenerateReqInput)
    out: dict[str, Any] = {}
    for name, body in bodies.items():
        result: dict[str, Any] = {"ignored_keys": sorted(set(body) - fields)}
        out[name] = result
        if contract_error is not None:
            result["contract"] = contract_error(body)
            if result["contract"] is not None:
                continue
        stage: dict[str, Any] = {}
        with captured(stage):
            try:
                obj = adapter.validate_python(body)
                obj.normalize_batch_and_arguments()
                params = SamplingParams(**(obj.sampling_params or {}))
                params.normalize(None)
                params.verify(vocab_size)
                stage["ok"] = True
            except Exception as exc:
                stage.update(ok=False, error=error_text(exc)[:800])
        result["ok"] = stage["ok"]
        if not stage["ok"]:
            result["error"] = stage["error"]
            continue
        pinned = getattr(obj, "routed_dp_rank", None)
        if pinned is None:
            pinned = getattr(obj, "data_parallel_rank", None)
        result["pinned_rank"] = pinned
        result["deprecations"] = [w for w in stage["python_warnings"] if "deprecated" in w]
    return out


# --- /metrics names -------------------------------------------------------------------------------

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count"), "gauge": ("",), "info": ("_info",)}  # fmt: skip
LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
          "moe_ep_rank": 0}  # fmt: skip


@contextlib.contextmanager
def published(sa: Any) -> Iterator[None]:
    """0.5.23's TokenizerMetricsCollector reads the published runtime config: publish one with
    the release's own test facility (``override_server_args``)."""
    try:
        from sglang.srt.runtime_context import get_context
    except ImportError:
        yield
        return
    if not hasattr(get_context(), "override_server_args"):
        yield
        return
    wanted = ("enable_metrics", "served_model_name", "model_path",
              "tokenizer_metrics_allowed_custom_labels", "extra_metric_labels",
              "collect_tokens_histogram")  # fmt: skip
    override = get_context().override_server_args(
        **{name: getattr(sa, name) for name in wanted if hasattr(sa, name)}
    )
    override.install()
    try:
        yield
    finally:
        override.restore()


def metric_names(module: types.ModuleType) -> dict[str, Any]:
    from prometheus_client import REGISTRY

    try:
        collectors = importlib.import_module("sglang.srt.observability.metrics_collector")
    except ImportError:  # 0.5.9
        collectors = importlib.import_module("sglang.srt.metrics.collector")
    server_args_cls = module.ServerArgs
    namespace = new_parser(server_args_cls).parse_args(
        ["--model-path", "moonshotai/Kimi-K2.5", "--enable-metrics"]
    )
    saved = server_args_cls.__dict__.get("__post_init__")
    if not hasattr(server_args_cls, "resolve_once") and saved is not None:
        server_args_cls.__post_init__ = lambda self: None
    try:
        sa = server_args_cls.from_cli_args(namespace)
    finally:
        if saved is not None:
            server_args_cls.__post_init__ = saved
    before = {family.name for family in REGISTRY.collect()}
    built = {}
    with published(sa):
        for name in ("SchedulerMetricsCollector", "TokenizerMetricsCollector"):
            cls = getattr(collectors, name)
            params = inspect.signature(cls.__init__).parameters
            kwargs: dict[str, Any] = {}
            if "server_args" in params:
                kwargs["server_args"] = sa
            if "labels" in params:
                kwargs["labels"] = (
                    dict(LABELS) if name.startswith("Scheduler") else {"model_name": "m"}
                )
            entry: dict[str, Any] = {}
            with captured(entry):
                try:
                    cls(**kwargs)
                    entry["ok"] = True
                except Exception as exc:
                    entry.update(ok=False, error=error_text(exc))
            built[name] = {k: entry[k] for k in ("ok", "error") if k in entry}
    families = {f.name: f.type for f in REGISTRY.collect() if f.name not in before}
    samples = sorted(n + s for n, t in families.items() for s in SUFFIXES.get(t, ("",)))
    return {"file": short(str(collectors.__file__)), "collectors": built,
            "families": families, "samples": samples}  # fmt: skip


# --- the run ----------------------------------------------------------------------------------


def kv_cells(jobs: dict[str, Any]) -> dict[str, Any]:
    """SGLang 0.5.23's KV cell per token for each ``config.json`` of ``jobs`` (the module
    docstring, ``kv_cells``)."""
    import tempfile
    from types import SimpleNamespace as Bag

    import torch
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.layers.cp import utils as cp_utils
    from sglang.srt.model_executor import pool_configurator as pools
    from sglang.srt.model_executor.model_runner_components.layer_setup import (
        resolve_layer_indices,
    )

    results: dict[str, Any] = {}
    for name, job in jobs.items():
        out: dict[str, Any] = {}
        with captured(out), tempfile.TemporaryDirectory() as folder:
            config = {k: v for k, v in job["config"].items() if k != "quantization_config"}
            (Path(folder) / "config.json").write_text(json.dumps(config))
            tp, dcp = int(job.get("tp", 1)), int(job.get("dcp", 1))
            ratio = job.get("swa_full_tokens_ratio")
            parallel = Bag(attn_tp_size=tp, attn_dcp_size=dcp, attn_cp_size=1,
                           enable_dsa_cache_layer_split=False)  # fmt: skip
            schedule = Bag(swa_full_tokens_ratio=0.8 if ratio is None else float(ratio),
                           _swa_full_tokens_ratio_explicitly_set=ratio is not None,
                           max_total_tokens=None)  # fmt: skip
            memory = Bag(enable_unified_memory=False, enable_hisparse=False)
            saved = (pools.get_parallel, pools.get_schedule, pools.get_memory,
                     cp_utils.get_parallel)  # fmt: skip
            # the accessors restored below, after this job: each binds this job's bags
            pools.get_parallel = cp_utils.get_parallel = lambda bag=parallel: bag
            pools.get_schedule = lambda bag=schedule: bag
            pools.get_memory = lambda bag=memory: bag
            try:
                model = ModelConfig(folder, trust_remote_code=False)
                layers = resolve_layer_indices(
                    model=Bag(), model_config=model, is_draft_worker=False
                )
                no_spec = Bag(is_eagle=lambda: False, is_standalone=lambda: False,
                              is_dflash_family=lambda: False)  # fmt: skip
                kvc = Bag(model_config=model, kv_cache_dtype=torch.bfloat16,
                          kv_cache_dtype_str="bf16", layer_info=layers,
                          server_args=Bag(enable_hisparse=False),
                          use_mla_backend=model.attention_arch == AttentionArch.MLA,
                          is_draft_worker=False, pp_size=1, spec_algorithm=no_spec,
                          spec_aux_config=Bag(eagle_draft_num_layers=None),
                          fused_entry_bytes=lambda kind: None,
                          dflash_draft_cell_size_per_token=None,
                          sliding_window_size=model.sliding_window_size, page_size=1)  # fmt: skip
                if model.is_hybrid_swa:
                    hybrid = pools.HybridSWAPoolConfigurator(kvc)
                    cell, configurator = hybrid._cell_size, "HybridSWAPoolConfigurator"
                else:
                    default = pools.DefaultPoolConfigurator.__new__(pools.DefaultPoolConfigurator)
                    default.kv_cache_dtype_str = "bf16"
                    cell = default._compute_cell_size(kvc, layers.num_effective_layers)
                    configurator = "DefaultPoolConfigurator"
                out.update(
                    cell_size=float(cell),
                    configurator=configurator,
                    attention_arch=model.attention_arch.name,
                    layers=layers.num_effective_layers,
                    full_layers=len(layers.full_attention_layer_ids or []),
                    swa_layers=len(layers.swa_attention_layer_ids or []),
                )
            except Exception as exc:
                out["error"] = error_text(exc)
                out["traceback"] = traceback.format_exc()[-3000:]
            finally:
                (pools.get_parallel, pools.get_schedule, pools.get_memory,
                 cp_utils.get_parallel) = saved  # fmt: skip
        results[name] = out
    return results


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--release-dir", required=True, type=Path)
    cli.add_argument("--out", required=True, type=Path, help="where the JSON report goes")
    args = cli.parse_args()
    job = json.load(sys.stdin)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    started = time.perf_counter()
    finder = install_stubs(args.release_dir)
    sys.path.insert(0, str(args.release_dir))
    report: dict[str, Any] = {}
    imported: dict[str, Any] = {}
    with captured(imported):
        try:
            module = importlib.import_module("sglang.srt.server_args")
        except BaseException as exc:  # SystemExit included: report, never die silently
            imported["error"] = error_text(exc)
            imported["traceback"] = traceback.format_exc()[-4000:]
    report["import"] = {
        "ok": "error" not in imported,
        "seconds": round(time.perf_counter() - started, 2),
        **{k: imported[k] for k in ("error", "traceback") if k in imported},
    }
    if "error" in imported:
        report["stubbed"] = sorted({m.split(".")[0] for m in finder.served})
        args.out.write_text(json.dumps(report))
        return 3
    report["release"] = sys.modules["sglang"].__version__
    timings = {}
    if job.get("argv"):
        mark = time.perf_counter()
        report["argv"] = {name: check_argv(module, argv) for name, argv in job["argv"].items()}
        timings["argv"] = round(time.perf_counter() - mark, 2)
    if job.get("kv_flags"):
        report["kv_flags"] = kv_flags(module)
    if job.get("bodies"):
        mark = time.perf_counter()
        report["bodies"] = check_bodies(job["bodies"], int(job.get("vocab_size", 163840)))
        timings["bodies"] = round(time.perf_counter() - mark, 2)
    if job.get("kv_cells"):
        mark = time.perf_counter()
        report["kv_cells"] = kv_cells(job["kv_cells"])
        timings["kv_cells"] = round(time.perf_counter() - mark, 2)
    if job.get("metrics"):
        mark = time.perf_counter()
        report["metrics"] = metric_names(module)
        timings["metrics"] = round(time.perf_counter() - mark, 2)
    report["stubbed"] = sorted({m.split(".")[0] for m in finder.served})
    report["seconds"] = {"import": report["import"]["seconds"], **timings,
                         "total": round(time.perf_counter() - started, 2)}  # fmt: skip
    args.out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
