"""Write the field lists of docs/run-directory.md from the line contract (rundir/lines.py).

Each ``<!-- fields: ModelName -->`` ... ``<!-- /fields -->`` block of the doc is replaced by a
table of that model's fields (name, type, what it holds), in the order they are written.

    python scripts/gen_docs.py           # rewrite the doc
    python scripts/gen_docs.py --check   # exit 1 (and name the blocks) if the doc is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import orjson
from pydantic import BaseModel

from eagledata.rundir import lines

DOC = Path(__file__).resolve().parents[1] / "docs" / "run-directory.md"
BLOCK = re.compile(r"(<!-- fields: (\w+) -->\n)(.*?)(<!-- /fields -->)", re.S)


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


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    fresh = render(text)
    if "--check" in argv:
        if fresh != text:
            print(f"{DOC} is stale: run 'python scripts/gen_docs.py'", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
