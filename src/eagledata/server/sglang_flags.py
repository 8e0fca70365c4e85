"""The SGLang version contract: which ``launch_server`` flags a pinned release accepts.

SGLang's ``server_args.py`` cannot be imported without torch, so its flags are read statically
with :mod:`ast`. Two declaration styles exist and both are understood:

* up to 0.5.13, ``parser.add_argument("--flag", ..., choices=...)`` calls inside
  ``ServerArgs.add_cli_args``;
* from 0.5.14, dataclass fields ``name: A[type, Arg(help=..., choices=..., aliases=[...])]``
  (``A`` is ``typing.Annotated``) turned into flags by ``add_cli_args_from_dataclass``, plus a
  few remaining ``add_argument`` calls for flags whose choices are computed at run time.

``choices`` are recorded when they are literal lists or built from module-level constants
(``["auto"] + X``, ``list(X)``); choices computed from run-time registries are marked
``choices_dynamic`` and left unchecked. ``scripts/extract_sglang_flags.py`` writes the contract of
a downloaded wheel as JSON; the JSON for the pinned releases ships in ``tests/data/``.

The pinned release is :data:`PINNED_SGLANG_VERSION`. A profile may name a later release when the
flag it needs does not exist in the pin (``--dcp-size`` first appears in 0.5.15).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PINNED_SGLANG_VERSION = "0.5.9"
"""First release with ``models/kimi_k25.py``; the HTTP contract in docs/sglang.md is S9's."""

DCP_SGLANG_VERSION = "0.5.15.post1"
"""First release line with ``--dcp-size`` (decode context parallelism); absent up to 0.5.14."""

CONTRACT_FORMAT = 1

# Actions that store a constant: the flag takes no value on the command line.
_NO_VALUE_ACTIONS = frozenset(
    {
        "store_true",
        "store_false",
        "store_const",
        "append_const",
        "count",
        "help",
        "version",
        "BooleanOptionalAction",
        "DeprecatedAction",
        "DeprecatedStoreTrueAction",
        "DeprecatedStoreConstAction",
    }
)


@dataclass(frozen=True)
class FlagSpec:
    """One ``launch_server`` option and every spelling of it."""

    names: tuple[str, ...]
    dest: str
    takes_value: bool = True
    nargs: str | None = None
    choices: tuple[str, ...] | None = None
    choices_dynamic: bool = False
    deprecated_for: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A compact dict: fields at their default are left out."""
        data: dict[str, Any] = {"names": list(self.names), "dest": self.dest}
        if not self.takes_value:
            data["takes_value"] = False
        if self.nargs is not None:
            data["nargs"] = self.nargs
        if self.choices is not None:
            data["choices"] = list(self.choices)
        if self.choices_dynamic:
            data["choices_dynamic"] = True
        if self.deprecated_for is not None:
            data["deprecated_for"] = self.deprecated_for
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlagSpec:
        choices = data.get("choices")
        return cls(
            names=tuple(str(n) for n in data["names"]),
            dest=str(data["dest"]),
            takes_value=bool(data.get("takes_value", True)),
            nargs=data.get("nargs"),
            choices=None if choices is None else tuple(str(c) for c in choices),
            choices_dynamic=bool(data.get("choices_dynamic", False)),
            deprecated_for=data.get("deprecated_for"),
        )


@dataclass(frozen=True)
class FlagContract:
    """Every flag of one SGLang release, with argparse's lookup rules."""

    sglang_version: str
    flags: tuple[FlagSpec, ...]
    source: str = ""
    _by_name: dict[str, FlagSpec] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for spec in self.flags:
            for name in spec.names:
                self._by_name[name] = spec

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._by_name)

    def resolve(self, option: str) -> FlagSpec | None:
        """The flag ``option`` means to argparse: an exact name or a unique prefix of one."""
        if option in self._by_name:
            return self._by_name[option]
        matches = {id(s): s for n, s in self._by_name.items() if n.startswith(option)}
        if len(matches) == 1:
            return next(iter(matches.values()))
        return None

    def check_argv(self, argv: Sequence[str]) -> list[str]:
        """Problems with ``argv`` for this release: unknown, ambiguous, deprecated, bad choice."""
        problems: list[str] = []
        i = 0
        while i < len(argv):
            token = argv[i]
            i += 1
            if not token.startswith("--"):
                problems.append(f"{token!r} is not an option (values follow their flag)")
                continue
            name, has_eq, inline = token.partition("=")
            spec = self._by_name.get(name)
            if spec is None:
                problems.append(f"{name} does not exist in sglang {self.sglang_version}")
                # skip a following value so one typo gives one problem
                if not has_eq and i < len(argv) and not argv[i].startswith("--"):
                    i += 1
                continue
            if spec.deprecated_for:
                problems.append(
                    f"{name} is deprecated in sglang {self.sglang_version}; "
                    f"use {spec.deprecated_for}"
                )
            if not spec.takes_value:
                if has_eq:
                    problems.append(f"{name} takes no value")
                continue
            values: list[str] = []
            if has_eq:
                values.append(inline)
            elif spec.nargs in ("+", "*"):
                while i < len(argv) and not argv[i].startswith("--"):
                    values.append(argv[i])
                    i += 1
            elif spec.nargs == "?":
                if i < len(argv) and not argv[i].startswith("--"):
                    values.append(argv[i])
                    i += 1
            elif i < len(argv):
                values.append(argv[i])
                i += 1
            if not values and spec.nargs not in ("?", "*"):
                problems.append(f"{name} needs a value")
            if spec.choices is not None:
                for value in values:
                    if value not in spec.choices:
                        allowed = ", ".join(spec.choices)
                        problems.append(f"{name} {value!r} is not one of: {allowed}")
        return problems

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CONTRACT_FORMAT,
            "sglang_version": self.sglang_version,
            "source": self.source,
            "flags": [spec.to_json() for spec in self.flags],
        }

    def dumps(self) -> str:
        """JSON text with one flag a line, so a regenerated contract diffs readably."""
        head = {k: v for k, v in self.to_json().items() if k != "flags"}
        lines = [json.dumps(spec.to_json(), ensure_ascii=False) for spec in self.flags]
        body = ",\n  ".join(lines)
        return json.dumps(head, ensure_ascii=False)[:-1] + ', "flags": [\n  ' + body + "\n]}\n"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlagContract:
        return cls(
            sglang_version=str(data["sglang_version"]),
            source=str(data.get("source", "")),
            flags=tuple(FlagSpec.from_json(f) for f in data["flags"]),
        )


def load_contract(path: str | Path) -> FlagContract:
    """Read a contract JSON written by ``scripts/extract_sglang_flags.py``."""
    with Path(path).open(encoding="utf-8") as handle:
        return FlagContract.from_json(json.load(handle))


def contract_path(directory: str | Path, version: str) -> Path:
    """Where the contract of ``version`` lives: ``sglang-<version>-server_args.json``."""
    return Path(directory) / f"sglang-{version}-server_args.json"


# --- static extraction -----------------------------------------------------------------------


_UNRESOLVED = object()


class _Evaluator:
    """Evaluates the small constant expressions SGLang uses for ``choices``."""

    def __init__(self, module: ast.Module) -> None:
        self.env: dict[str, ast.expr] = {}
        for node in module.body:
            self._collect(node)

    def _collect(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.env[target.id] = node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and node.value is not None
            and isinstance(node.target, ast.Name)
        ):
            self.env[node.target.id] = node.value

    def with_locals(self, body: Iterable[ast.stmt]) -> _Evaluator:
        child = _Evaluator.__new__(_Evaluator)
        child.env = dict(self.env)
        for node in body:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign | ast.AnnAssign):
                    child._collect(sub)
        return child

    def value(self, node: ast.expr, depth: int = 0) -> Any:
        if depth > 20:
            return _UNRESOLVED
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = [self.value(e, depth + 1) for e in node.elts]
            if any(item is _UNRESOLVED for item in items):
                return _UNRESOLVED
            return items
        if isinstance(node, ast.Name):
            bound = self.env.get(node.id)
            return _UNRESOLVED if bound is None else self.value(bound, depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            return _UNRESOLVED
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("list", "tuple", "sorted", "set")
            and len(node.args) == 1
            and not node.keywords
        ):
            inner = self.value(node.args[0], depth + 1)
            if isinstance(inner, list):
                return sorted(inner, key=str) if node.func.id in ("sorted", "set") else inner
            return _UNRESOLVED
        return _UNRESOLVED

    def choices(self, node: ast.expr | None) -> tuple[tuple[str, ...] | None, bool]:
        """``(choices, dynamic)``: literal choices, or ``(None, True)`` if computed at run time."""
        if node is None:
            return None, False
        resolved = self.value(node)
        if isinstance(resolved, list):
            return tuple(str(v) for v in resolved), False
        return None, True


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


def _action_name(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return "?"


def _str_or_none(evaluator: _Evaluator, node: ast.expr | None) -> str | None:
    if node is None:
        return None
    value = evaluator.value(node)
    return value if isinstance(value, str) else None


def _flag_from_add_argument(call: ast.Call, evaluator: _Evaluator) -> FlagSpec | None:
    names = [
        a.value
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
    ]
    if not names:
        return None
    kw = _keywords(call)
    action = _action_name(kw.get("action"))
    nargs_value = evaluator.value(kw["nargs"]) if "nargs" in kw else None
    nargs = None if nargs_value in (None, _UNRESOLVED) else str(nargs_value)
    takes_value = action not in _NO_VALUE_ACTIONS and nargs != "0"
    choices, dynamic = evaluator.choices(kw.get("choices"))
    dest = _str_or_none(evaluator, kw.get("dest"))
    long_names = [n for n in names if n.startswith("--")] or names
    if dest is None:
        dest = long_names[0].lstrip("-").replace("-", "_")
    all_names = list(names)
    if action == "BooleanOptionalAction":
        all_names += ["--no-" + n[2:] for n in names if n.startswith("--")]
    deprecated_for = None
    if action is not None and action.startswith("Deprecated"):
        deprecated_for = _str_or_none(evaluator, kw.get("new_flag")) or "(removed)"
    return FlagSpec(
        names=tuple(all_names),
        dest=dest,
        takes_value=takes_value,
        nargs=nargs,
        choices=choices,
        choices_dynamic=dynamic,
        deprecated_for=deprecated_for,
    )


def _annotated_parts(annotation: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """``(type, metadata)`` of ``A[type, meta]`` / ``Annotated[type, meta]``, else None."""
    if not isinstance(annotation, ast.Subscript):
        return None
    head = annotation.value
    head_name = head.id if isinstance(head, ast.Name) else getattr(head, "attr", None)
    if head_name not in ("A", "Annotated"):
        return None
    parts = annotation.slice
    if not isinstance(parts, ast.Tuple) or len(parts.elts) < 2:
        return None
    return parts.elts[0], parts.elts[1]


def _subscript_head(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):
        head = node.value
        if isinstance(head, ast.Name):
            return head.id
        if isinstance(head, ast.Attribute):
            return head.attr
    return None


def _unwrap_optional(node: ast.expr) -> ast.expr:
    head = _subscript_head(node)
    if head == "Optional" and isinstance(node, ast.Subscript):
        return node.slice
    if head == "Union" and isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
        rest = [e for e in node.slice.elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(rest) == 1:
            return rest[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) == 1:
            return rest[0]
    return node


def _flag_from_field(name: str, annotation: ast.expr, evaluator: _Evaluator) -> FlagSpec | None:
    """Mirror of SGLang's ``add_cli_args_from_dataclass`` for one field."""
    parts = _annotated_parts(annotation)
    if parts is None:
        return None
    raw_type, meta = parts
    kw: dict[str, ast.expr] = {}
    if isinstance(meta, ast.Call) and _action_name(meta.func) == "Arg":
        kw = _keywords(meta)
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
        return None
    if "no_cli" in kw and evaluator.value(kw["no_cli"]) is True:
        return None
    cli_name = _str_or_none(evaluator, kw.get("cli_name")) or "--" + name.replace("_", "-")
    aliases_value = evaluator.value(kw["aliases"]) if "aliases" in kw else []
    aliases = [a for a in aliases_value if isinstance(a, str)] if aliases_value else []
    names = (cli_name, *aliases)

    action = _action_name(kw.get("action"))
    explicit_choices, dynamic = evaluator.choices(kw.get("choices"))
    nargs_value = evaluator.value(kw["nargs"]) if "nargs" in kw else None
    nargs = None if nargs_value in (None, _UNRESOLVED) else str(nargs_value)
    inner = _unwrap_optional(raw_type)
    head = _subscript_head(inner)

    if action is not None:
        return FlagSpec(
            names=names,
            dest=name,
            takes_value=action not in _NO_VALUE_ACTIONS,
            nargs=nargs,
            choices=explicit_choices,
            choices_dynamic=dynamic,
        )
    if head == "Literal" and isinstance(inner, ast.Subscript):
        literal = evaluator.value(inner.slice)
        values = literal if isinstance(literal, list) else [literal]
        choices = explicit_choices or tuple(str(v) for v in values)
        return FlagSpec(names=names, dest=name, choices=choices)
    has_type_parser = "type_parser" in kw
    if head in ("List", "list") and not has_type_parser:
        return FlagSpec(
            names=names,
            dest=name,
            nargs=nargs or "+",
            choices=explicit_choices,
            choices_dynamic=dynamic,
        )
    if isinstance(inner, ast.Name) and inner.id == "bool":
        return FlagSpec(names=names, dest=name, takes_value=False)
    return FlagSpec(
        names=names,
        dest=name,
        nargs=nargs,
        choices=explicit_choices,
        choices_dynamic=dynamic,
    )


def _find_class(module: ast.Module, name: str) -> ast.ClassDef | None:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _iter_add_argument_calls(node: ast.AST) -> Iterator[ast.Call]:
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "add_argument"
        ):
            yield sub


def extract_flags(source: str, *, class_name: str = "ServerArgs") -> list[FlagSpec]:
    """Every ``launch_server`` flag declared in an SGLang ``server_args.py`` source text."""
    module = ast.parse(source)
    evaluator = _Evaluator(module)
    cls = _find_class(module, class_name)
    if cls is None:
        raise ValueError(f"no class {class_name} in this source")

    flags: dict[str, FlagSpec] = {}

    def add(spec: FlagSpec) -> None:
        # a later declaration of the same dest wins, as it does for dataclass fields
        flags[spec.dest + "|" + spec.names[0]] = spec

    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            spec = _flag_from_field(item.target.id, item.annotation, evaluator)
            if spec is not None:
                add(spec)

    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "add_cli_args":
            local = evaluator.with_locals(item.body)
            for call in _iter_add_argument_calls(item):
                spec = _flag_from_add_argument(call, local)
                if spec is not None:
                    add(spec)

    return sorted(flags.values(), key=lambda s: s.names[0])


def extract_contract(source: str, *, sglang_version: str, origin: str = "") -> FlagContract:
    return FlagContract(
        sglang_version=sglang_version, flags=tuple(extract_flags(source)), source=origin
    )
