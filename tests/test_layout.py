"""The package shows its architecture, its imports go one way, and each class is read in one
module (docs/architecture.md).

Every package and top-level module has a layer of its own, lowest first; a module may import its
own package or a lower layer, never a higher one, and nothing outside ``cli`` imports it. One
layer per package, not peers sharing one: two packages on one layer could import each other, and
an arrow between them (``server`` importing ``capacity`` while ``capacity`` imports ``server``)
would go unseen.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import eagledata

PACKAGE = Path(eagledata.__file__).parent

ORDER = (
    "__init__",  # the package's face: its version
    "errors",  # the one error tree
    "tasks",  # task scopes whose end is bounded
    "atomic",  # the one atomic write
    "config",  # the settings
    "profiles",  # launch profiles and the model's KV cell: configuration
    "rundir",  # the run directory: its files, their contract, reading and checking them
    "simserver",  # the simulated SGLang server
    "source",  # dataset rows -> messages -> prompt ids -> work items
    "server",  # HTTP to SGLang, its facts, the bf16 guard, launching it
    "capacity",  # the planner and the concurrency controller's arithmetic
    "quality",  # record flags and the logprob canary
    "run",  # the write path: one session of generation
    "export",  # run directories -> trainer files
    "report",  # run directories -> the HTML report
    "library",  # the Python API a trainer calls: rounds, records, datasets
    "cli",  # the thin typer shell
)
LAYER = {name: position for position, name in enumerate(ORDER)}
FACE = ("eagledata.__init__", "eagledata.library")
"""The one import that goes up: the package's face names the library's calls (``eagledata.
regenerate``), loaded on first use (a module ``__getattr__``), so no lower layer loads them."""


def concern(module: str) -> str:
    """``eagledata.run.writer`` -> ``run``; ``eagledata.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> set[str]:
    """The eagledata modules ``path`` imports; ``from pkg import sub`` names ``pkg.sub`` when it
    is a module, else ``pkg`` (a name its ``__init__`` holds)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "eagledata" or node.module.startswith("eagledata."):
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    found.add(submodule if is_module(submodule) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("eagledata."))
    return found


def is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative).is_dir()


def source_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        modules["eagledata." + ".".join(relative.parts)] = path
    return modules


def test_every_module_sits_in_a_known_concern() -> None:
    unknown = {m for m in source_modules() if concern(m) not in LAYER}
    assert not unknown, f"give these a place in ORDER (and docs/architecture.md): {sorted(unknown)}"


def test_the_top_level_holds_only_the_settings_the_errors_and_two_primitives() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "errors", "tasks", "atomic"}
    assert (PACKAGE / "config" / "__init__.py").is_file()  # the settings: a package by section
    assert (PACKAGE / "cli" / "__init__.py").is_file()  # the shell: a package of its commands


def test_the_face_loads_the_library_only_when_asked() -> None:
    """``import eagledata`` (what every lower module's ``__version__`` import runs) loads none
    of the library: its one upward import is inside ``__getattr__`` and under TYPE_CHECKING."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    top_level = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert all(not (getattr(n, "module", "") or "").startswith("eagledata") for n in top_level)
    import eagledata as face

    assert face.regenerate is face.library.regenerate


def test_imports_never_go_up_a_layer() -> None:
    upward = []
    for module, path in source_modules().items():
        mine = LAYER[concern(module)]
        for target in imported_modules(path):
            if (module, target) == FACE:
                continue
            theirs = LAYER.get(concern(target))
            outside_cli = concern(target) == "cli" and concern(module) != "cli"
            if theirs is None or theirs > mine or outside_cli:
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(upward)


def test_no_module_imports_itself_through_others() -> None:
    """No circle of imports, even inside one package (type-only imports count: a circle that
    type checking needs is still two modules that cannot be read apart)."""
    modules = source_modules()

    def resolve(target: str) -> str:  # ``from eagledata.capacity import X``: its __init__
        return target if target in modules else f"{target}.__init__"

    graph = {
        module: {
            resolve(t)
            for t in imported_modules(path)
            if resolve(t) in modules and (module, t) != FACE
        }
        for module, path in modules.items()
    }
    circles: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(circles)


def test_one_atomic_write() -> None:
    """Every file replaced in place goes through ``atomic.py``: no other module renames a
    temporary file over another or fsyncs a folder by hand."""
    renames = {
        "eagledata.atomic",
        "eagledata.run.writer",  # seals a journal: renamed into shards/, the commit itself
        "eagledata.rundir.telemetry",  # rotates the telemetry file: a rename, not a rewrite
    }
    patterns = ("os.replace(", "os.rename(", ".replace(tmp", "def fsync_dir", "O_RDONLY")
    by_hand = [
        module
        for module, path in source_modules().items()
        if module not in renames and any(p in path.read_text() for p in patterns)
    ]
    assert not by_hand, by_hand


def parsed_modules() -> dict[str, ast.Module]:
    """Every module of the package, parsed once."""
    return {module: ast.parse(path.read_text()) for module, path in source_modules().items()}


def imported_names(tree: ast.Module) -> dict[str, str]:
    """The names a module imports from eagledata modules: name -> the module it comes from."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eagledata"):
            for alias in node.names:
                names[alias.asname or alias.name] = node.module
    return names


def defining_module(
    module: str, name: str, trees: dict[str, ast.Module], classes: set[tuple[str, str]]
) -> str:
    """Where ``name``, imported from ``module``, is defined (a package's ``__init__`` only
    re-exports what its modules define)."""
    for _ in range(5):
        if (module, name) in classes:
            return module
        tree = trees.get(module) or trees.get(f"{module}.__init__")
        found = None if tree is None else imported_names(tree).get(name)
        if found is None:
            return module
        module = found
    return module


def base_name(base: ast.expr) -> str | None:
    """``Base`` or ``Base[T]`` -> ``"Base"``."""
    if isinstance(base, ast.Subscript):
        base = base.value
    return base.id if isinstance(base, ast.Name) else None


def test_no_class_is_spread_over_modules() -> None:
    """A class is read in one module: none builds on a base from another module that exists
    only to be built on (a mixin, a state base, a chain of partial classes split to keep
    modules short). A base from elsewhere is fine when it is the error tree, when it carries
    no behaviour (a settings base such as ``Strict``: configuration only), or when it is a
    whole class used on its own that another specialises (``IdsRows`` and ``HfRows``)."""
    trees = parsed_modules()
    classes = {
        (module, node.name): node
        for module, tree in trees.items()
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }
    sources = "\n".join(path.read_text() for path in source_modules().values())
    spread = []
    for (module, name), node in classes.items():
        imports = imported_names(trees[module])
        for base in node.bases:
            base_id = base_name(base)
            if base_id is None or base_id not in imports:
                continue
            home = defining_module(imports[base_id], base_id, trees, set(classes))
            definition = classes.get((home, base_id))
            if home == module or definition is None or home == "eagledata.errors":
                continue
            behaviour = any(
                isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in definition.body
            )
            used_alone = re.search(rf"(?<!class )\b{base_id}(\[[^\]]*\])?\(", sources) is not None
            if behaviour and not used_alone:
                spread.append(f"{module}.{name} builds on {home}.{base_id}")
    assert not spread, "one class, one module (compose instead):\n" + "\n".join(spread)
