"""The package shows its architecture, and its imports go one way (DESIGN.md, Layout).

Layers, lowest first: ``errors``/``config``; ``server``, ``capacity``, ``quality`` and
``simserver`` (peers); ``run`` (the data path, which uses all of them); ``export`` and ``report``
(readers of run directories); ``cli``. A module may import its own layer or a lower one, never a
higher one, and nothing outside ``cli`` imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import eagledata

PACKAGE = Path(eagledata.__file__).parent

LAYER = {
    "__init__": 0,
    "errors": 0,
    "tasks": 0,
    "config": 0,
    "server": 1,
    "capacity": 1,
    "quality": 1,
    "simserver": 1,
    "run": 2,
    "export": 3,
    "report": 3,
    "cli": 4,
}


def concern(module: str) -> str:
    """``eagledata.run.writer`` -> ``run``; ``eagledata.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "eagledata":  # a submodule, or a name of the package itself
                found.update(
                    f"eagledata.{a.name}" if a.name in LAYER else "eagledata" for a in node.names
                )
            elif node.module.startswith("eagledata."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("eagledata."))
    return found


def source_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        modules["eagledata." + ".".join(relative.parts)] = path
    return modules


def test_every_module_sits_in_a_known_concern() -> None:
    unknown = {m for m in source_modules() if concern(m) not in LAYER}
    assert not unknown, f"add these concerns to LAYER (and DESIGN.md's layout): {sorted(unknown)}"


def test_the_top_level_holds_only_the_shell_the_settings_and_the_errors() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "config", "errors", "tasks"}
    assert (PACKAGE / "cli" / "__init__.py").is_file()  # the shell: a package of its commands


def test_imports_never_go_up_a_layer() -> None:
    upward = []
    for module, path in source_modules().items():
        mine = LAYER[concern(module)]
        for target in imported_modules(path):
            theirs = LAYER.get(concern(target))
            outside_cli = concern(target) == "cli" and concern(module) != "cli"
            if theirs is None or theirs > mine or outside_cli:
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(upward)
