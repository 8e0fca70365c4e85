"""Lets the registry's torchvision import beside a CPU build of torch (installed with a .pth file).

The torchvision wheel on the package registry for linux x86_64 is built for CUDA; next to the CPU
torch its ``_C`` extension does not load, so its ``torchvision::*`` ops are never defined, and
``torchvision/_meta_registrations.py`` then fails at import on
``register_fake("torchvision::nms")``.
SGLang imports torchvision at module level (its multimodal utilities, via its config package)
but never calls these ops for a text model. Just before that module runs, this hook defines the
two schemas it needs when torchvision's own ops are missing; calling them still fails.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_TARGET = "torchvision._meta_registrations"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_kept: list[Any] = []  # the Library object must outlive the import


def _define_missing() -> None:
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops():
        return  # a torchvision whose extension loaded defines them itself
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        library.define(schema)
    _kept.append(library)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname == _TARGET:
            sys.meta_path.remove(self)
            _define_missing()
        return None  # the normal finders load the module itself


def install() -> None:
    if not any(isinstance(finder, _Hook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
