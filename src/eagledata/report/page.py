"""The report as one self-contained HTML file: inline CSS, PNGs as data URIs, no script.

Nothing on the page loads from anywhere but itself, so it can be mailed, attached to a PR or
opened offline. The headline table shows the ``status --json`` object, which is also embedded
verbatim (a ``<pre>`` in a closed ``<details>``) for anyone who wants to check a number.
"""

from __future__ import annotations

import base64
import datetime as dt
from html import escape
from typing import Any

import orjson

from eagledata import __version__
from eagledata.report.mix import mix_table
from eagledata.report.rundata import RunData
from eagledata.report.sections import WIDTH_IN, Plot, duration
from eagledata.rundir.rates import MIN_RATED_S, TOO_SHORT
from eagledata.rundir.status import lane_key

CSS = """
:root { --ink:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#f6f8fa; --ok:#1a7f37;
        --bad:#cf222e; --warn:#9a6700; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       color:var(--ink); background:#fff; }
main { max-width:1120px; margin:0 auto; padding:24px 28px 40px; }
h1 { font-size:22px; margin:0 0 4px; }
h2 { font-size:16px; margin:0 0 2px; }
.sub { color:var(--muted); margin:0 0 16px; }
.sub code { font-size:12.5px; }
.state { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px;
         font-weight:600; vertical-align:middle; margin-left:6px; }
.state.done { background:#dafbe1; color:var(--ok); }
.state.running { background:#fff8c5; color:var(--warn); }
.cards { display:grid; grid-template-columns:repeat(auto-fill, minmax(150px, 1fr)); gap:10px;
         margin:0 0 14px; }
.card { border:1px solid var(--line); border-radius:8px; padding:8px 12px; background:#fff; }
.card .k { color:var(--muted); font-size:12px; }
.card .v { font-size:20px; font-weight:600; font-variant-numeric:tabular-nums; }
.card .n { color:var(--muted); font-size:12px; }
table.headline { border-collapse:collapse; width:100%; margin:0 0 8px; }
table.headline th { text-align:left; font-weight:500; color:var(--muted); width:190px;
                    vertical-align:top; padding:5px 12px 5px 0; }
table.headline td { padding:5px 0; border-top:1px solid #eaeef2;
                    font-variant-numeric:tabular-nums; }
table.headline tr:first-child td { border-top:none; }
.bad { color:var(--bad); font-weight:600; }
.ok { color:var(--ok); font-weight:600; }
section { border-top:1px solid var(--line); padding:16px 0 6px; }
.caption { color:var(--muted); margin:2px 0 8px; }
.missing { color:var(--muted); font-style:italic; margin:2px 0 6px; }
img { display:block; max-width:100%; height:auto; }
.pair { display:grid; grid-template-columns:1fr 1fr; gap:24px; }
.pair > section { border-top:none; padding-top:0; }
@media (max-width: 900px) { .pair { grid-template-columns:1fr; } }
table.mix { border-collapse:collapse; width:100%; font-size:13px; margin:4px 0 8px; }
table.mix th { text-align:left; font-weight:500; color:var(--muted); padding:4px 8px 4px 0;
               vertical-align:bottom; border-bottom:1px solid var(--line); }
table.mix td { padding:4px 8px 4px 0; border-top:1px solid #eaeef2; vertical-align:top;
               font-variant-numeric:tabular-nums; }
details { margin-top:10px; color:var(--muted); }
pre { background:var(--bg); padding:10px; border-radius:6px; overflow:auto; font-size:12px; }
footer { color:var(--muted); font-size:12px; border-top:1px solid var(--line); padding-top:10px;
         margin-top:18px; }
"""


def _utc(moment: float | None) -> str:
    if moment is None:
        return "?"
    return dt.datetime.fromtimestamp(moment, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _count(value: Any) -> str:
    return "?" if value is None else f"{value:,}"


def _reasons(counts: dict[str, int], total: int) -> str:
    if not counts:
        return "none"
    parts = []
    for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        share = f" ({count / total:.1%})" if total else ""
        parts.append(f"{escape(name)} {count:,}{share}")
    return ", ".join(parts)


def _canary(canary: dict[str, Any]) -> str:
    checks, baseline = canary.get("checks", 0), canary.get("baseline", 0)
    if not checks and not baseline:
        if canary.get("disabled_by_flag"):
            return "off (--no-canary)"
        return "on, no check yet" if canary.get("enabled") else "off (no quality.jsonl)"
    failed, errors = canary.get("failed", 0), canary.get("errors", 0)
    text = f"{checks:,} checks, {canary.get('passed', 0):,} passed, "
    text += f'<span class="{"bad" if failed else "ok"}">{failed:,} failed</span>'
    if errors:
        text += f", {errors:,} could not run"
    last = canary.get("last")
    if isinstance(last, dict):
        text += (
            f"; last {escape(str(last.get('verdict', '?')))} on "
            f"{escape(str(last.get('server', '?')))} at {_utc(last.get('time'))}"
        )
    return text


def _load(load: dict[str, Any] | list[dict[str, Any]] | None) -> str:
    """The latest sample per server (and DP rank): a list of telemetry lines, or a mapping."""
    if not load:
        return "no telemetry"
    samples = list(load.values()) if isinstance(load, dict) else list(load)
    parts = []
    for sample in samples:
        if not isinstance(sample, dict):
            continue
        where = lane_key(sample)
        usage = sample.get("token_usage")
        usage_text = f"KV {usage:.0%}" if isinstance(usage, int | float) else "KV ?"
        parts.append(
            f"{escape(where)}: {usage_text}, {_count(sample.get('num_running_reqs'))} running, "
            f"{_count(sample.get('num_queue_reqs'))} queued"
        )
    return "<br>".join(sorted(parts))


def headline_rows(status: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key in ``status --json``, label, HTML value) for the headline table."""
    written = status.get("written") or 0
    eta = status.get("eta_s")
    tok_s = status.get("tok_s") or {}
    quality = status.get("quality") or {}
    flags = quality.get("flags") or {}
    spec = status.get("speculative")
    failure_reasons = status.get("failure_reasons") or {}
    failed_total = (status.get("failed") or 0) + (status.get("skipped") or 0)
    return [
        (
            "planned",
            "planned",
            _count(status.get("planned"))
            + (
                ""
                if status.get("plan_complete")
                else " (estimate: the dataset is not read to its end)"
            ),
        ),
        ("written", "written", _count(status.get("written"))),
        ("failed", "failed", _count(status.get("failed"))),
        ("skipped", "skipped", _count(status.get("skipped"))),
        ("left", "left", _count(status.get("left"))),
        (
            "output_tokens",
            "output tokens",
            f"{_count(status.get('output_tokens'))} "
            f"(prompt tokens {_count(status.get('prompt_tokens'))})",
        ),
        ("tok_s", "output tok/s", _rates(tok_s)),
        ("eta_s", "ETA", "plan done" if status.get("left") == 0 else _eta(eta)),
        ("finish_reasons", "finish reasons", _reasons(status.get("finish_reasons") or {}, written)),
        ("failure_reasons", "failure reasons", _reasons(failure_reasons, failed_total)),
        ("quality.flags", "record flags", _reasons(flags, written) if flags else "none"),
        ("quality.canary", "canary", _canary(quality.get("canary") or {})),
        ("load", "server load (latest)", _load(status.get("load"))),
        (
            "speculative",
            "speculative decoding",
            "not used" if not spec else f"accept length {spec.get('accept_length', 0):.2f}",
        ),
    ]


def _cards(status: dict[str, Any]) -> str:
    planned, written = status.get("planned"), status.get("written") or 0
    done = written + (status.get("failed") or 0) + (status.get("skipped") or 0)
    progress = f"{done / planned:.1%} of the plan done" if planned else "plan size unknown"
    tok_s = (status.get("tok_s") or {}).get("overall")
    finish = status.get("finish_reasons") or {}
    cut = finish.get("length", 0)
    cards = [
        ("written", _count(written), progress),
        (
            "left",
            _count(status.get("left")),
            "plan done" if status.get("left") == 0 else f"ETA {_eta(status.get('eta_s'))}",
        ),
        (
            "output tok/s",
            "-" if tok_s is None else f"{tok_s:,.0f}",
            TOO_SHORT if tok_s is None else "over the run's active time",
        ),
        ("cut at max_new_tokens", f"{cut / written:.1%}" if written else "-", f"{cut:,} answers"),
        (
            "failed + skipped",
            _count((status.get("failed") or 0) + (status.get("skipped") or 0)),
            "see failures below",
        ),
    ]
    return "".join(
        f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
        f'<div class="n">{escape(n)}</div></div>'
        for k, v, n in cards
    )


def _rates(tok_s: dict[str, Any]) -> str:
    """The run's rate as ``status`` defines it (rundir/rates.py), and the last 10 minutes'."""
    overall, recent = tok_s.get("overall"), tok_s.get("recent")
    active = float(tok_s.get("active_s") or 0.0)
    if overall is None:
        return f"{TOO_SHORT} ({active:,.1f} s of active time; rates need {MIN_RATED_S:g} s)"
    text = f"{overall:,.1f} over the run's {duration(active)} of active time"
    if recent is not None:
        text += f", {recent:,.1f} in the last 10 min"
    return text


def _eta(value: Any) -> str:
    return "?" if value is None else duration(float(value))


def _section(plot: Plot, alone: bool = True) -> str:
    parts = [f'<section id="{plot.key}"><h2>{escape(plot.title)}</h2>']
    if plot.png is None:
        parts.append(f'<p class="missing">{escape(plot.missing or "Not drawn.")}</p>')
    else:
        if plot.caption:
            parts.append(f'<p class="caption">{escape(plot.caption)}</p>')
        data = base64.b64encode(plot.png).decode()
        # Figures are sized in inches against a 10-inch full row; a pair fills its cell.
        width = f"{min(plot.width_in / WIDTH_IN, 1.0):.0%}" if alone else "100%"
        parts.append(
            f'<img alt="{escape(plot.title)}" style="width:{width}" '
            f'src="data:image/png;base64,{data}">'
        )
    parts.append("</section>")
    return "".join(parts)


def render_page(data: RunData, plots: list[list[Plot]]) -> str:
    """``plots`` is a list of rows: one plot a row is drawn full width, two side by side."""
    status, info = data.status, data.info
    finished = bool(status.get("plan_complete")) and status.get("left") == 0
    state = (
        '<span class="state done">finished</span>'
        if finished
        else '<span class="state running">in progress or stopped</span>'
    )
    servers = ", ".join(info.servers) or "?"
    sub = (
        f"run <code>{escape(info.run_dir)}</code> · dataset <b>{escape(info.dataset)}</b> · "
        f"model {escape(info.model or '?')} · KV cache {escape(', '.join(info.kv_dtypes) or '?')}"
        f" · servers {escape(servers)} · max_new_tokens {_count(info.max_new_tokens)} · "
        f"started {_utc(info.started_at)}"
    )
    rows = "".join(
        f'<tr data-key="{escape(key)}"><th>{escape(label)}</th><td>{value}</td></tr>'
        for key, label, value in headline_rows(status)
    )
    body = []
    for row in plots:
        if len(row) == 1:
            body.append(_section(row[0]))
        else:
            body.append(
                '<div class="pair">' + "".join(_section(p, alone=False) for p in row) + "</div>"
            )
            body[-1] = f'<section class="row">{body[-1]}</section>'
    status_json = orjson.dumps(status, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    skipped = ""
    if data.skipped_lines:
        skipped = (
            " Lines skipped as malformed: "
            + ", ".join(
                f"{escape(name)} {count:,}" for name, count in sorted(data.skipped_lines.items())
            )
            + "."
        )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>eagledata report: {escape(info.dataset)} ({escape(info.run_dir)})</title>
<style>{CSS}</style>
</head>
<body>
<main>
<h1>eagledata run report {state}</h1>
<p class="sub">{sub}</p>
<div class="cards">{_cards(status)}</div>
<table class="headline" id="headline">{rows}</table>
<details><summary>the same numbers as <code>eagledata status --json</code></summary>
<pre id="status-json">{escape(status_json)}</pre></details>
<section id="mix"><h2>The mix: per dataset</h2>{mix_table(status, data.records)}</section>
{"".join(body)}
<footer>Made by eagledata {escape(__version__)} at {_utc(data.generated_at)} from committed data
only (sealed shards and whole journal lines); a run in progress has moved on since.{skipped}
</footer>
</main>
</body>
</html>
"""
