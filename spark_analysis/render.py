"""The operator's dashboard: one self-contained HTML page from the job's results.

Why separate from the job: rendering works on plain Python rows already
collected from Spark, so it can be read, changed and tested without Spark.
The page loads nothing from the network: styles are inline, charts are the
inline SVG of :mod:`spark_analysis.svg`, and there is no script at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from spark_analysis import aggregates as ag
from spark_analysis import phases as ph
from spark_analysis import round_metrics as rm
from spark_analysis import svg
from spark_analysis import trace_schema as ts

Row = Mapping[str, object]

PHASE_COLORS = ("#4e79a7", "#f28e2b", "#b07aa1", "#76b7b2", "#59a14f")
DISTRIBUTION_COLOR = "#9cc3e6"
CURVE_COLOR = "#2b6cb0"
RAW_ROWS_SHOWN = 2000
"""Rows of the raw summary put in the page; all of them are in summary.csv."""
PROBLEM_ROWS_SHOWN = 200

SECTIONS = (
    ("headline", "Headline"),
    ("phases", "Where the unavailability goes"),
    ("distributions", "Unavailability distribution"),
    ("throughput", "Throughput dip"),
    ("phase-statistics", "Phase statistics"),
    ("input-problems", "Input problems"),
    ("raw-summary", "Raw per-round summary"),
    ("definitions", "Definitions"),
)
"""(id, heading) of every section, in page order."""

STYLE = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin-bottom:4px} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:36px}
h3{margin:18px 0 4px} p.meta{color:#555;margin-top:0}
nav a{margin-right:14px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f0f3f7} th[colspan]{text-align:center} td.text,th.text{text-align:left}
tr.bad td{background:#fde2e2} td.bad,span.bad{color:#b00020;font-weight:bold}
.alert{padding:10px 14px;margin:10px 0;border-radius:4px}
.alert.red{background:#fde2e2;border:2px solid #b00020;color:#7a0016}
.alert.amber{background:#fff4d6;border:1px solid #d9a400}
.alert.green{background:#e3f4e1;border:1px solid #4c9a2a}
.scroll{overflow-x:auto} details summary{cursor:pointer;font-weight:bold}
"""


@dataclass(frozen=True)
class Curve:
    """Acks per bucket around the fault of one round, for the throughput-dip chart."""

    title: str
    round: Row
    points: list[tuple[float, float]]
    """(bucket start in s relative to the fault, acks in that bucket)."""


@dataclass(frozen=True)
class DashboardData:
    """Everything the page shows, already collected from Spark."""

    inputs: Sequence[str]
    generated: str
    summary: Sequence[Row]
    aggregates: Sequence[Row]
    rejected: Sequence[Row]
    malformed: Sequence[Row]
    malformed_total: int
    curves: Sequence[Curve] = field(default_factory=list)
    job_seconds: float | None = None


def config_label(row: Row, with_fault: bool = True) -> str:
    """E.g. "kill9 · TTL 3 s · 3 nodes · 1000 msg/s"."""
    parts = [str(row[ts.FAULT])] if with_fault else []
    parts += [
        f"TTL {svg.fmt(row[ts.LEASE_TTL_S])} s",
        f"{row[ts.NODES]} nodes",
        f"{svg.fmt(row[ts.LOAD_MSG_S])} msg/s",
    ]
    return " · ".join(parts)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1,
           bad_rows: Sequence[bool] = (), groups: Sequence[tuple[str, int]] = ()) -> str:
    """An HTML table; cells are already-escaped HTML, the first ``text_columns`` left-aligned.

    ``groups``: an optional header row above ``headers`` of (title, columns spanned).
    """
    group_row = "".join(f'<th colspan="{span}">{escape(title)}</th>' for title, span in groups)
    head = "".join(
        f'<th class="text">{escape(h)}</th>' if i < text_columns else f"<th>{escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for r, cells in enumerate(rows):
        klass = ' class="bad"' if r < len(bad_rows) and bad_rows[r] else ""
        tds = "".join(
            f'<td class="text">{c}</td>' if i < text_columns else f"<td>{c}</td>"
            for i, c in enumerate(cells)
        )
        body.append(f"<tr{klass}>{tds}</tr>")
    group_row = f"<tr>{group_row}</tr>" if groups else ""
    return (f'<div class="scroll"><table>{group_row}<tr>{head}</tr>{"".join(body)}'
            "</table></div>")


def _count(n: int, noun: str) -> str:
    """"1 round", "2 rounds"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _stat(row: Row, duration: str, stat: str) -> object:
    return row[ag.stat_column(duration, stat)]


def _pct(share: object) -> str:
    return f"{100 * float(share):.1f} %"


def _alerts(data: DashboardData) -> str:
    rounds = len(data.summary)
    lossy = sum(1 for r in data.summary if (r[ts.LOST_ACKNOWLEDGED] or 0) > 0)
    unrecovered = sum(1 for r in data.summary if not r[rm.RECOVERED])
    out = []
    if not rounds:
        out.append('<div class="alert amber">No usable round in the traces: see '
                   '<a href="#input-problems">Input problems</a>.</div>')
    elif lossy:
        lost = sum(r[ts.LOST_ACKNOWLEDGED] or 0 for r in data.summary)
        out.append(
            f'<div class="alert red" id="lost-alert"><b>{lossy} of {_count(rounds, "round")} '
            f"lost acknowledged messages ({_count(lost, 'message')} in all).</b> An "
            "acknowledged message must never be lost: see the rows in red below.</div>"
        )
    else:
        out.append(
            f'<div class="alert green">No acknowledged message was lost in '
            f"{_count(rounds, 'round')}.</div>"
        )
    if unrecovered:
        out.append(
            f'<div class="alert amber">{_count(unrecovered, "round")} never accepted a send after '
            "the fault: counted as unrecovered and left out of the percentiles.</div>"
        )
    problems = len(data.rejected) + data.malformed_total
    if problems:
        out.append(
            '<div class="alert amber">Input problems: '
            f'{_count(data.malformed_total, "malformed line")}, '
            f'{_count(len(data.rejected), "round")} left out. See <a href="#input-problems">'
            "Input problems</a>.</div>"
        )
    return "".join(out)


def _headline(data: DashboardData) -> str:
    u, b = ph.UNAVAILABILITY.column, ph.BACK_TO_STEADY_MS
    groups = [("", 3), ("total unavailability, ms", 4), ("back to steady, ms", 2),
              ("messages", 2)]
    headers = ["configuration", "rounds", "unrecovered", "p50", "p90", "p99", "max", "p50", "p99",
               "rounds losing acked", "duplicated"]
    rows, bad = [], []
    for a in data.aggregates:
        lossy = (a[ag.LOSSY_ROUNDS] or 0) > 0
        share = _pct(a[ag.LOSSY_SHARE])
        rows.append([
            escape(config_label(a)),
            str(a[ag.ROUNDS]),
            f'<span class="bad">{a[ag.UNRECOVERED]}</span>' if a[ag.UNRECOVERED] else "0",
            *[svg.fmt(_stat(a, u, s)) for s in ("p50", "p90", "p99", "max")],
            svg.fmt(_stat(a, b, "p50")),
            svg.fmt(_stat(a, b, "p99")),
            f'<span class="bad">{share} ({a[ag.LOSSY_ROUNDS]})</span>' if lossy else share,
            str(a[ts.DUPLICATED]),
        ])
        bad.append(lossy)
    return _table(headers, rows, bad_rows=bad, groups=groups)


def _phase_charts(data: DashboardData) -> str:
    out = [
        "<p>Median (p50) of each phase from the fault to the first accepted send, one bar per "
        "configuration. Medians of phases need not add up to the median total.</p>"
    ]
    for fault in sorted({str(a[ts.FAULT]) for a in data.aggregates}):
        rows = [
            (config_label(a, with_fault=False),
             [_stat(a, p.column, "p50") for p in ph.SEQUENTIAL])
            for a in data.aggregates if a[ts.FAULT] == fault
        ]
        out.append(f"<h3>{escape(fault)}</h3>")
        out.append(svg.stacked_bars(
            f"Phases of the failover after {fault}, p50 per configuration",
            [p.label for p in ph.SEQUENTIAL], PHASE_COLORS, rows, "ms",
        ))
    return "".join(out)


def _distributions(data: DashboardData) -> str:
    u = ph.UNAVAILABILITY.column
    out = [
        "<p>Per fault type: a box plot per configuration (box: p25 to p75 with a bar at p50; "
        "whiskers: min to max; diamond: p99, nearest rank) and a histogram of all its "
        "recovered rounds.</p>"
    ]
    for fault in sorted({str(r[ts.FAULT]) for r in data.summary}):
        values = [float(r[u]) for r in data.summary if r[ts.FAULT] == fault and r[u] is not None]
        if not values:
            continue
        boxes = [
            (config_label(a, with_fault=False),
             svg.Box(*[float(_stat(a, u, s)) for s in ("min", "p25", "p50", "p75", "p99", "max")]))
            for a in data.aggregates if a[ts.FAULT] == fault and _stat(a, u, "count")
        ]
        out.append(f"<h3>{escape(fault)}: {len(values)} recovered rounds</h3>")
        out.append(svg.box_plots(f"Total unavailability after {fault}, per configuration",
                                 boxes, "ms", DISTRIBUTION_COLOR))
        out.append(svg.histogram(f"Histogram of total unavailability after {fault}", values,
                                 "ms", DISTRIBUTION_COLOR))
    return "".join(out)


def _throughput(data: DashboardData) -> str:
    if not data.curves:
        return "<p>No round has enough acknowledgement buckets to draw (2 s before the fault).</p>"
    out = [
        "<p>Messages acknowledged per 100 ms bucket around the fault (t = 0). Dotted lines: "
        "the steady rate (mean of the 2 s before the fault) and 90 % of it; the rate is back "
        "to steady at the first of 3 consecutive buckets at or above 90 %.</p>"
    ]
    for curve in data.curves:
        r = curve.round
        markers = [(0.0, "fault")]
        if r[ph.UNAVAILABILITY.column] is not None:
            markers.append((float(r[ph.UNAVAILABILITY.column]) / 1000, "first accepted send"))
        if r[ph.BACK_TO_STEADY_MS] is not None:
            markers.append((float(r[ph.BACK_TO_STEADY_MS]) / 1000, "back to steady"))
        steady = float(r[rm.STEADY])
        out.append(f"<h3>{escape(curve.title)}: round {escape(str(r[ts.ROUND]))} "
                   f"({escape(config_label(r))})</h3>")
        out.append(svg.step_chart(
            f"Acks per 100 ms around the fault, {curve.title}", curve.points,
            ts.ACK_BUCKET_MS / 1000, "seconds since the fault", "acks / 100 ms", CURVE_COLOR,
            markers, [(steady, "steady"), (steady * 0.9, "90 %")],
        ))
    return "".join(out)


def _phase_statistics(data: DashboardData) -> str:
    headers = ["configuration"] + list(ag.STATS)
    out = ["<p>All durations in ms; p = nearest-rank percentile; a phase a round never reached "
           "is not counted. Click a phase to open it; aggregates.csv has them all.</p>"]
    for d in ph.DURATION_COLUMNS:
        rows = [[escape(config_label(a))] + [svg.fmt(_stat(a, d, s)) for s in ag.STATS]
                for a in data.aggregates]
        is_open = " open" if d == ph.UNAVAILABILITY.column else ""
        out.append(f"<details{is_open}><summary>{escape(ph.DURATION_LABELS[d])}</summary>"
                   f"{_table(headers, rows)}</details>")
    return "".join(out)


def _problems(data: DashboardData) -> str:
    out = [f"<p>{_count(data.malformed_total, 'malformed line')} (ignored) and "
           f"{_count(len(data.rejected), 'rejected round')} (left out of every figure). All of "
           "them are in problems.csv.</p>"]
    if data.rejected:
        out.append("<h3>Rejected rounds</h3>")
        out.append(_table(
            ["file", "line", "round", "reason"],
            [[escape(str(p["file"])), str(p["line"]), escape(str(p[ts.ROUND])),
              escape(str(p["reason"]))] for p in data.rejected[:PROBLEM_ROWS_SHOWN]],
            text_columns=4,
        ))
    if data.malformed:
        out.append("<h3>Malformed lines</h3>")
        out.append(_table(
            ["file", "line", "reason", "text"],
            [[escape(str(p["file"])), str(p["line"]), escape(str(p["reason"])),
              f"<code>{escape(str(p['text']))}</code>"]
             for p in data.malformed[:PROBLEM_ROWS_SHOWN]],
            text_columns=4,
        ))
    return "".join(out)


def _raw_summary(data: DashboardData) -> str:
    u = ph.UNAVAILABILITY.column
    ordered = sorted(data.summary, key=lambda r: (r[u] is not None, -(r[u] or 0)))
    shown = ordered[:RAW_ROWS_SHOWN]
    columns = [c for c in rm.SUMMARY_COLUMNS if c != "file"]
    rows = [[escape(str(r[c])) if c in (ts.ROUND, ts.FAULT, ts.PRIMARY, rm.NEW_PRIMARY)
             else svg.fmt(r[c]) if isinstance(r[c], float) else escape(str(r[c]))
             for c in columns] for r in shown]
    note = (f"All {len(ordered)} rounds" if len(shown) == len(ordered)
            else f"The {len(shown)} rounds with the longest unavailability of {len(ordered)}")
    return (
        f"<details><summary>{note}, unrecovered first, then by unavailability "
        "(summary.csv and summary.parquet hold every round)</summary>"
        + _table(columns, rows, bad_rows=[(r[ts.LOST_ACKNOWLEDGED] or 0) > 0 for r in shown])
        + "</details>"
    )


def _definitions() -> str:
    items = [
        f"<li><b>{escape(p.label)}</b>: from <code>{p.start}</code> to <code>{p.end}</code></li>"
        for p in ph.PHASES
    ]
    return (
        "<p>Each milestone is the first event of its kind at or after the fault "
        "(<code>fault_injected</code>); durations are in ms, exact to the µs.</p>"
        f"<ul>{''.join(items)}<li><b>back to steady rate</b>: from the fault to the first of 3 "
        "consecutive 100 ms buckets with at least 90 % of the steady rate, but not before the "
        "first accepted send</li></ul>"
        "<p>Percentiles are nearest-rank: the p-th percentile of n sorted values is the value "
        "at rank ⌈p·n/100⌉. The trace format is described in docs/failover-traces.md.</p>"
    )


def render_dashboard(data: DashboardData) -> str:
    """The whole page as one HTML string."""
    bodies = {
        "headline": _alerts(data) + _headline(data),
        "phases": _phase_charts(data),
        "distributions": _distributions(data),
        "throughput": _throughput(data),
        "phase-statistics": _phase_statistics(data),
        "input-problems": _problems(data),
        "raw-summary": _raw_summary(data),
        "definitions": _definitions(),
    }
    nav = "".join(f'<a href="#{sid}">{escape(title)}</a>' for sid, title in SECTIONS)
    sections = "".join(
        f'<section id="{sid}"><h2>{escape(title)}</h2>{bodies[sid]}</section>'
        for sid, title in SECTIONS
    )
    took = f", job took {data.job_seconds:.1f} s" if data.job_seconds is not None else ""
    meta = (f"{len(data.summary)} rounds from {escape(', '.join(data.inputs))}; "
            f"generated {escape(data.generated)}{took}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>Failover dashboard</title>"
        f"<style>{STYLE}</style></head><body><h1>Failover dashboard</h1>"
        f'<p class="meta">{meta}</p><nav>{nav}</nav>{sections}</body></html>\n'
    )
