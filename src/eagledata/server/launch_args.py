"""The argument check of ``launch-server``: nothing but a bf16 KV cache reaches SGLang.

Before anything starts, the whole argument list is checked: a KV cache dtype other than bf16, an
fp8-scales file, a draft KV dtype other than bf16 (``--speculative-draft-kv-cache-dtype``,
0.5.23), relaxed speculative acceptance (lossy) or a ``--config`` YAML (which could set the dtype
out of sight) is refused with ``LaunchError``. The shell script repeats the dtype check as a
second line of defence, and after start-up the server's own ``/server_info`` goes through the
bf16 guard.

Argument matching follows argparse, including unambiguous prefixes (``--kv-cache fp8_e4m3``
means ``--kv-cache-dtype fp8_e4m3`` to SGLang) and the ``--flag=value`` form.
"""

from __future__ import annotations

from collections.abc import Sequence

from eagledata.errors import LaunchError
from eagledata.profiles.profile import BF16_KV_DTYPES

KV_REASON = (
    "eagledata serves only a bf16 KV cache: an fp8 KV cache degraded Kimi-K2.5 "
    "(INT4 weights, compressed MLA latent) and poisons the drafter's training data"
)

_KV_FLAG = "--kv-cache-dtype"
_KV_MIN_PREFIX = len("--kv-c")
# The draft's own KV dtype (0.5.23; default: follows --kv-cache-dtype). Shortest prefix argparse
# takes for it: --speculative-draft-k (tests/test_sglang_releases.py checks both against each
# release's own parser).
_DRAFT_KV_FLAG = "--speculative-draft-kv-cache-dtype"
_DRAFT_KV_MIN_PREFIX = len("--speculative-draft-k")
_SCALES_FLAG = "--quantization-param-path"
_SCALES_MIN_PREFIX = len("--quantization-")
_CONFIG_FLAG = "--config"
_CONFIG_MIN_PREFIX = len("--conf")
# Relaxed speculative acceptance (below SGLang's default 1.0) trades the target distribution for
# speed: lossy like an fp8 KV cache (server/speculative.py). Shortest unique argparse prefixes.
_THRESHOLD_FLAGS = ("--speculative-accept-threshold-single", "--speculative-accept-threshold-acc")
_THRESHOLD_MIN_PREFIX = len("--speculative-accept-threshold-s")
_MODEL_FLAGS = ("--model-path", "--model")


def _is_prefix_of(name: str, flag: str, min_length: int) -> bool:
    """True when argparse could read ``name`` as ``flag`` (exact, or a long-enough prefix)."""
    return len(name) >= min_length and flag.startswith(name)


def _refuse_kv_value(flag: str, value: str) -> LaunchError:
    if flag.startswith("--speculative"):
        return LaunchError(
            f"refused {flag} {value}: the draft model's KV cache must be bf16 too ({KV_REASON}). "
            "Fix: drop it; the draft's KV dtype follows --kv-cache-dtype bf16"
        )
    if value == "auto":
        why = (
            "SGLang silently resolves 'auto' to fp8 for checkpoints that declare an fp8 KV "
            f"cache; {KV_REASON}"
        )
    else:
        why = KV_REASON
    return LaunchError(
        f"refused {flag} {value}: {why}. Fix: drop the override; every launch profile "
        f"passes {_KV_FLAG} bf16"
    )


def check_server_args(argv: Sequence[str]) -> None:
    """Raise ``LaunchError`` if ``argv`` could give SGLang anything but a bf16 KV cache."""
    seen_kv = False
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, has_value, inline = token.partition("=")
        target = _is_prefix_of(name, _KV_FLAG, _KV_MIN_PREFIX)
        if target or _is_prefix_of(name, _DRAFT_KV_FLAG, _DRAFT_KV_MIN_PREFIX):
            if has_value:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise LaunchError(f"refused {name}: it needs a value. Fix: {_KV_FLAG} bf16")
            if value not in BF16_KV_DTYPES:
                raise _refuse_kv_value(name, value)
            seen_kv = seen_kv or target
        elif _is_prefix_of(name, _SCALES_FLAG, _SCALES_MIN_PREFIX):
            raise LaunchError(
                f"refused {name}: it loads KV scaling factors, used only by an fp8 KV cache; "
                f"{KV_REASON}. Fix: remove it"
            )
        elif any(_is_prefix_of(name, f, _THRESHOLD_MIN_PREFIX) for f in _THRESHOLD_FLAGS):
            value = inline if has_value else (argv[i] if i < len(argv) else "")
            try:
                lossless = float(value) >= 1.0
            except ValueError:
                lossless = False
            if not lossless:
                raise LaunchError(
                    f"refused {name} {value}: relaxed speculative acceptance is lossy (the "
                    "answers stop following the target model's distribution). Fix: remove it; "
                    "SGLang's default 1.0 is exact"
                )
        elif _is_prefix_of(name, _CONFIG_FLAG, _CONFIG_MIN_PREFIX):
            raise LaunchError(
                f"refused {name}: a YAML config can set kv-cache-dtype out of sight of this "
                "check. Fix: put the flags in the profile's [sglang_args] or pass them as "
                "extra arguments"
            )
    if not seen_kv:
        raise LaunchError(f"refused: no {_KV_FLAG} given. Fix: pass {_KV_FLAG} bf16")


def model_from_argv(argv: Sequence[str]) -> str | None:
    """The model path SGLang will load: the last ``--model-path``/``--model`` value."""
    model: str | None = None
    for index, token in enumerate(argv):
        name, has_value, inline = token.partition("=")
        if name in _MODEL_FLAGS:
            if has_value:
                model = inline
            elif index + 1 < len(argv):
                model = argv[index + 1]
    return model
