"""A pure-PyTorch stand-in for the CPU half of SGLang's ``sgl_kernel`` package, for CPUs without it.

SGLang 0.5.23 run with ``SGLANG_USE_CPU_ENGINE=1`` imports a few ``sgl_kernel`` CPU ops at module
level, but that package (``sglang-kernel-cpu``, C++ built from SGLang's ``csrc/cpu``) has no
wheel on the package registry. Every other op it would speed up is used only on CPUs with Intel
AMX; without AMX SGLang runs its own native PyTorch paths. So this module registers, as
``torch.ops.sgl_kernel.*`` and as module attributes, the ops those paths still call:

* ``assign_req_to_token_pool_cpu``: writes each request's new KV slots into its row of the
  request-to-token table (called on every batch);
* ``copy_all_layer_kv_cache_cpu``: copies KV rows between slots in every layer's buffer;
* ``murmur_hash32_cpu``: the hash behind per-request ``sampling_seed``.

Their semantics are SGLang's own Triton kernels' (``write_req_to_token_pool_triton`` in
``srt/mem_cache/allocation.py``, ``copy_all_layer_kv_cache_tiled`` in
``kernels/ops/kvcache/cache_move.py``, ``murmur_hash32_kernel`` in
``kernels/ops/sampling/murmur_hash.py``), which the C++ CPU kernels mirror. Any other name raises
:class:`MissingKernel`, which names what is missing: a feature that needs it (speculative
decoding, AMX-packed weights, ...) cannot run on this stand-in.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import NoReturn

import torch

__version__ = "0.0.0+eagledata.cpu"

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
_LIB.define(
    "assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token, "
    "Tensor start_offset, Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()"
)
_LIB.define(
    "copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, "
    "Tensor src_loc) -> ()"
)
_LIB.define("murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor")


class MissingKernel(NotImplementedError):
    """An op this stand-in does not provide, called."""


def _missing(name: str) -> Callable[..., NoReturn]:
    def missing(*args: object, **kwargs: object) -> NoReturn:
        raise MissingKernel(
            f"sgl_kernel.{name} is not available: this sgl_kernel is a pure-PyTorch stand-in "
            "providing only assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu and "
            "murmur_hash32_cpu (SGLang's CPU kernel package sglang-kernel-cpu has no wheel); "
            "run the server without the feature that needs it"
        )

    missing.__name__ = name
    return missing


def __getattr__(name: str) -> Callable[..., NoReturn]:
    # SGLang imports ops of features that cannot run here (speculative decoding's tree kernels,
    # ...) at module level on the CPU engine: the import succeeds, a call fails saying why.
    if name.startswith("_"):
        raise AttributeError(name)
    return _missing(name)


def _assign_req_to_token_pool(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    # Request i's slots are out_cache_loc[sum of the earlier requests' lengths :][: its length],
    # written to req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]].
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        count = end - start
        if count <= 0:
            continue
        if end > pool_len:
            raise ValueError(f"assign_req_to_token_pool_cpu: end {end} past pool_len {pool_len}")
        req_to_token[row, start:end] = out_cache_loc[taken : taken + count].to(req_to_token.dtype)
        taken += count


def _copy_all_layer_kv_cache(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    # Each buffer (one per layer, K and V) is rows of strides[i] bytes at address data_ptrs[i];
    # row src_loc[j] is copied to row tgt_loc[j]. Every source row is read before any target is
    # written, as the Triton kernel loads a tile before storing it.
    sources = src_loc.to(torch.int64)
    targets = tgt_loc.to(torch.int64)
    if sources.numel() == 0:
        return
    rows = int(torch.maximum(sources.max(), targets.max()).item()) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        table = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        table[targets] = table[sources].clone()


_MASK32 = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = (k * 0xCC9E2D51) & _MASK32
    k = _rotl32(k, 15)
    k = (k * 0x1B873593) & _MASK32
    h = h ^ k
    h = _rotl32(h, 13)
    return (h * 5 + 0xE6546B64) & _MASK32


def _murmur_hash32(
    seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor
) -> torch.Tensor:
    # MurmurHash3 (32-bit) of four 4-byte blocks: seed low, seed high, position, column; the
    # products of two 32-bit values fit in int64, so every step is exact there.
    seed64 = seed.to(torch.int64)  # a uint64 seed's bits, reinterpreted
    low = (seed64 & _MASK32).unsqueeze(1)
    high = ((seed64 >> 32) & _MASK32).unsqueeze(1)
    pos = (positions.to(torch.int64) & _MASK32).unsqueeze(1)
    col = (col_indices.to(torch.int64) & _MASK32).unsqueeze(0)
    h = torch.zeros_like(low)
    h = _mix(h, low)
    h = _mix(h, high)
    h = _mix(h, pos)
    h = _mix(h.expand(-1, col.shape[1]), col.expand(h.shape[0], -1))
    h = h ^ 16
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    h = h ^ (h >> 16)
    return h.to(torch.uint32)


_LIB.impl("assign_req_to_token_pool_cpu", _assign_req_to_token_pool, "CPU")
_LIB.impl("copy_all_layer_kv_cache_cpu", _copy_all_layer_kv_cache, "CPU")
_LIB.impl("murmur_hash32_cpu", _murmur_hash32, "CPU")

assign_req_to_token_pool_cpu = torch.ops.sgl_kernel.assign_req_to_token_pool_cpu.default
copy_all_layer_kv_cache_cpu = torch.ops.sgl_kernel.copy_all_layer_kv_cache_cpu.default
murmur_hash32_cpu = torch.ops.sgl_kernel.murmur_hash32_cpu.default
