"""Write the generated parts of the docs from the code they describe.

* docs/run-directory.md: each ``<!-- fields: ModelName -->`` ... ``<!-- /fields -->`` block is
  replaced by a table of that model's fields of the line contract (``rundir/lines.py``): name,
  type, what it holds, in the order they are written.
* docs/architecture.md: the ``<!-- modules -->`` ... ``<!-- /modules -->`` block is replaced by
  the module map: every module of the package, by package, with the first sentence of its
  docstring (what it owns). A module without a docstring fails the check.
* any doc: each ``<!-- registry: NAME -->`` ... ``<!-- /registry -->`` block is replaced by the
  table of that extension point's registry (``REGISTRIES``): the data files and row shapes a
  dataset may have (docs/guide.md), the load signals a server may offer (docs/sglang.md).

    python scripts/gen_docs.py           # rewrite the docs
    python scripts/gen_docs.py --check   # exit 1 (and name the docs) if one is stale
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
from pydantic import BaseModel

from eagledata.rundir import lines

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "run-directory.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "src" / "eagledata"
BLOCK = re.compile(r"(<!-- fields: (\w+) -->\n)(.*?)(<!-- /fields -->)", re.S)
MODULES = re.compile(r"(<!-- modules -->\n)(.*?)(<!-- /modules -->)", re.S)
REGISTRY = re.compile(r"(<!-- registry: ([\w-]+) -->\n)(.*?)(<!-- /registry -->)", re.S)


def type_name(annotation: object) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    text = text.replace("typing.", "").replace("eagledata.rundir.lines.", "")
    text = re.sub(r"Literal\[(.*?)\]", lambda m: " or ".join(m.group(1).split(", ")), text)
    # JSON's words, and no "|": the tables are Markdown
    return text.replace(" | ", " or ").replace("None", "null").replace("'", "`")


def table(model: type[BaseModel]) -> str:
    rows = ["| field | type | holds |", "|---|---|---|"]
    for name, info in model.model_fields.items():
        kind = type_name(info.annotation)
        if not info.is_required():
            default = info.get_default(call_default_factory=True)
            kind += f", default `{orjson.dumps(default).decode()}`"
        rows.append(f"| `{name}` | {kind} | {info.description or ''} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    def fill(match: re.Match[str]) -> str:
        model = getattr(lines, match.group(2))
        return match.group(1) + table(model) + match.group(4)

    return BLOCK.sub(fill, text)


def first_sentence(path: Path) -> str:
    """What a module owns: its docstring's first sentence, on one line."""
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    if not docstring:
        raise SystemExit(f"{path} has no docstring: say what it owns in its first sentence")
    paragraph = " ".join(docstring.split("\n\n", 1)[0].split())
    depth, end = 0, len(paragraph)
    for index, char in enumerate(paragraph):
        depth += {"(": 1, ")": -1}.get(char, 0)
        following = paragraph[index + 1 : index + 2]
        if depth == 0 and char in ".?" and following in ("", " "):
            end = index + (char == "?")
            break
    sentence = paragraph[:end].rstrip(":")
    # Markdown's code spans, and no "|" to break the table's row
    return sentence.replace("``", "`").replace("|", "\\|")


def module_map() -> str:
    """One table: every module, the top-level ones first, then each package's, by name (the
    layers are the doc's own table), and what it owns."""
    rows = ["| module | owns |", "|---|---|"]
    top = sorted(p for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    for path in top:
        rows.append(f"| `{path.name}` | {first_sentence(path)} |")
    packages = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    for package in packages:
        for path in sorted(package.glob("*.py")):
            rows.append(f"| `{package.name}/{path.name}` | {first_sentence(path)} |")
    return "\n".join(rows) + "\n"


def render_architecture(text: str) -> str:
    return MODULES.sub(lambda m: m.group(1) + module_map() + m.group(3), text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def dataset_files_table() -> str:
    from eagledata.source.formats import FILE_TYPES

    rows = ["| file | holds | rows counted up front (a mix's row count) |", "|---|---|---|"]
    for kind in FILE_TYPES.values():
        counted = "yes" if kind.count is not None else "no: give a share"
        rows.append(f"| `{kind.suffix}` | {_cell(kind.summary)} | {counted} |")
    return "\n".join(rows) + "\n"


def row_schemas_table() -> str:
    from eagledata.source.prompts import ROW_SCHEMAS

    rows = ["| schema | a row | found under `auto` by the field |", "|---|---|---|"]
    for shape in ROW_SCHEMAS.values():
        field = f"`{shape.field}`" if shape.field else "`prompt_field`'s"
        rows.append(f"| `{shape.name}` | {_cell(shape.summary)} | {field} |")
    return "\n".join(rows) + "\n"


def load_signals_table() -> str:
    from eagledata.server.load_signals import LOAD_SIGNALS

    rows = ["| source | asked | offered | gives | read |", "|---|---|---|---|---|"]
    for rank, signal in enumerate(LOAD_SIGNALS.values()):
        if rank == 0:
            read = "first"
        elif signal.supplements is not None:
            read = "always: fills in a better one, else stands in for it"
        else:
            read = "when none above answers"
        rows.append(
            f"| `{signal.name}` | `GET {signal.route}` | {_cell(signal.since)} | "
            f"{_cell(signal.summary)} | {read} |"
        )
    return "\n".join(rows) + "\n"


REGISTRIES = {
    "dataset-files": dataset_files_table,
    "row-schemas": row_schemas_table,
    "load-signals": load_signals_table,
}
"""The registries whose tables the docs hold, by the name their block gives."""


def render_registries(text: str) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in REGISTRIES:
            raise SystemExit(f"no registry {name!r} (known: {', '.join(REGISTRIES)})")
        return match.group(1) + REGISTRIES[name]() + match.group(4)

    return REGISTRY.sub(fill, text)


def generated_docs() -> list[tuple[Path, Callable[[str], str]]]:
    """Every doc with a generated part, and what rewrites it."""
    own: dict[Path, Callable[[str], str]] = {DOC: render, ARCHITECTURE: render_architecture}
    docs: list[tuple[Path, Callable[[str], str]]] = []
    for path in sorted((REPO / "docs").glob("*.md")):
        first = own.get(path)
        if first is None and not REGISTRY.search(path.read_text()):
            continue
        docs.append((path, _then_registries(first)))
    return docs


def _then_registries(first: Callable[[str], str] | None) -> Callable[[str], str]:
    return lambda text: render_registries(first(text) if first else text)


def main(argv: list[str]) -> int:
    stale = []
    for doc, fill in generated_docs():
        text = doc.read_text()
        fresh = fill(text)
        if fresh == text:
            continue
        if "--check" in argv:
            stale.append(doc)
        else:
            doc.write_text(fresh)
    for doc in stale:
        print(f"{doc} is stale: run 'python scripts/gen_docs.py'", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
