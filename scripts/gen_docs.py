"""Write the generated parts of the docs from the code they describe.

* docs/run-directory.md: each ``<!-- fields: ModelName -->`` ... ``<!-- /fields -->`` block is
  replaced by a table of that model's fields of the line contract (``rundir/lines.py``): name,
  type, what it holds, in the order they are written.
* docs/architecture.md: the ``<!-- modules -->`` ... ``<!-- /modules -->`` block is replaced by
  the module map: every module of the package, by package, with the first sentence of its
  docstring (what it owns). A module without a docstring fails the check.

    python scripts/gen_docs.py           # rewrite the docs
    python scripts/gen_docs.py --check   # exit 1 (and name the docs) if one is stale
"""

from __future__ import annotations

import ast
import re
import sys
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


def main(argv: list[str]) -> int:
    stale = []
    for doc, fill in ((DOC, render), (ARCHITECTURE, render_architecture)):
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
