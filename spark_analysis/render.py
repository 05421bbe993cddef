"""The operator's dashboard: one self-contained HTML page from the job's results.

Why separate from the job: rendering works on plain Python rows already
collected from Spark, so it can be read, changed and tested without Spark.
The page loads nothing from the network: styles are inline, charts are the
inline SVG of :mod:`spark_analysis.svg`, and there is no script at all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from spark_analysis import aggregates as ag
from spark_analysis import nemesis as nm
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
NEMESIS_ROWS_SHOWN = 2000
"""Rows of the nemesis table put in the page (failing rounds first); nemesis.csv has all."""
IDS_SHOWN = 10
"""Lost or unexpected ids listed per failing round (the trace has the first 20)."""
INJECTION_COLORS = ("#59a14f", "#e15759")
"""Injections in passing rounds, in failing rounds."""
ROLE_LABELS = {
    ts.ROLE_FAULT: "fault",
    ts.ROLE_RECOVERY: "recovery",
    ts.ROLE_CHECK: "check",
    ts.ROLE_SCRIPT: "scripted client / wait",
}

SECTIONS = (
    ("headline", "Headline"),
    ("nemesis", "Nemesis checker"),
    ("fault-types", "Fault types"),
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
th{background:#f0f3f7;white-space:normal} th[colspan]{text-align:center} td.text,th.text{text-align:left}
tr.bad td{background:#fde2e2} td.bad,span.bad{color:#b00020;font-weight:bold}
.alert{padding:10px 14px;margin:10px 0;border-radius:4px}
.alert.red{background:#fde2e2;border:2px solid #b00020;color:#7a0016}
.alert.amber{background:#fff4d6;border:1px solid #d9a400}
.alert.green{background:#e3f4e1;border:1px solid #4c9a2a}
.scroll{overflow-x:auto} details summary{cursor:pointer;font-weight:bold}
tr.total td{font-weight:bold;background:#f4f4f4} td.zero{color:#aaa}
td.wrap{white-space:normal;min-width:120px}
ul.failing li{margin:3px 0}
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
    nemesis: Sequence[Row] = ()
    """One row per nemesis round, columns ``nemesis.NEMESIS_COLUMNS``."""
    fault_types: Sequence[Row] = ()
    """One row per fault type, columns ``nemesis.FAULT_TYPE_COLUMNS``."""
    fault_role_totals: Sequence[Row] = ()
    """The same columns, one row per role ("all fault ops", ...)."""


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
           bad_rows: Sequence[bool] = (), groups: Sequence[tuple[str, int]] = (),
           total_rows: Sequence[bool] = (), text_at: Collection[int] = ()) -> str:
    """An HTML table; cells are already-escaped HTML, the first ``text_columns`` and those
    at the indexes ``text_at`` left-aligned.

    ``groups``: an optional header row above ``headers`` of (title, columns spanned).
    ``bad_rows`` are shown red, ``total_rows`` bold.  A cell may be given as
    ``(html, css class)``.
    """
    def is_text(i: int) -> bool:
        return i < text_columns or i in text_at

    group_row = "".join(f'<th colspan="{span}">{escape(title)}</th>' for title, span in groups)
    head = "".join(
        f'<th class="text">{escape(h)}</th>' if is_text(i) else f"<th>{escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for r, cells in enumerate(rows):
        klass = (' class="bad"' if r < len(bad_rows) and bad_rows[r]
                 else ' class="total"' if r < len(total_rows) and total_rows[r] else "")
        tds = []
        for i, cell in enumerate(cells):
            html, css = cell if isinstance(cell, tuple) else (cell, "")
            css = " ".join(c for c in ("text" if is_text(i) else "", css) if c)
            tds.append(f'<td class="{css}">{html}</td>' if css else f"<td>{html}</td>")
        tds = "".join(tds)
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
    out.append(_nemesis_alert(data))
    problems = len(data.rejected) + data.malformed_total
    if problems:
        out.append(
            '<div class="alert amber">Input problems: '
            f'{_count(data.malformed_total, "malformed line")}, '
            f'{_count(len(data.rejected), "round")} left out. See <a href="#input-problems">'
            "Input problems</a>.</div>"
        )
    return "".join(out)


def _verdict_counts(rows: Sequence[Row]) -> dict[str, int]:
    return {v: sum(1 for r in rows if r[nm.VERDICT] == v) for v in ts.VERDICTS}


def _rejected_nemesis(data: DashboardData) -> int:
    return sum(1 for r in data.rejected if r.get(ts.FAULT) == ts.FAULT_NEMESIS)


def _nemesis_alert(data: DashboardData) -> str:
    """Red if a nemesis round failed the checker, green if all passed, nothing without any."""
    out = []
    rounds = len(data.nemesis)
    failing = sum(1 for r in data.nemesis if r[nm.FAILING])
    if failing:
        counts = _verdict_counts(data.nemesis)
        which = ", ".join(f"{counts[v]} {v}" for v in ts.VERDICTS[1:] if counts[v])
        out.append(
            f'<div class="alert red" id="nemesis-alert"><b>{failing} of '
            f'{_count(rounds, "nemesis round")} failed the checker</b> ({which}): see '
            '<a href="#nemesis">Nemesis checker</a>.</div>'
        )
    elif rounds:
        out.append(
            f'<div class="alert green" id="nemesis-alert">All {_count(rounds, "nemesis round")} '
            "passed the checker: nothing lost or unexpected, every replica check matched.</div>"
        )
    rejected = _rejected_nemesis(data)
    if rejected:
        out.append(
            f'<div class="alert amber">{_count(rejected, "nemesis round")} rejected: '
            'their checker results are not shown (see <a href="#input-problems">Input '
            "problems</a>).</div>"
        )
    return "".join(out)


def _n(value: object, bad_if_positive: bool = False, grey_zero: bool = False) -> object:
    """A count as a cell: red and bold if ``bad_if_positive`` and > 0, grey if zero."""
    if value is None:
        return "–"
    if bad_if_positive and value:
        return f'<span class="bad">{value}</span>'
    if grey_zero and not value:
        return ("0", "zero")
    return str(value)


def _ops_cell(row: Row) -> str:
    """E.g. "12" or "12 (1 skipped, 1 failed)"; failed ops (a node exited unasked) in red."""
    parts = []
    for outcome, column in nm.OPS_BY_OUTCOME.items():
        if row[column]:
            text = f"{row[column]} {outcome}"
            parts.append(f'<span class="bad">{text}</span>' if outcome == "failed" else text)
    return str(row[nm.OPS]) + (f" ({', '.join(parts)})" if parts else "")


def _schedule_name(row: Row) -> str:
    """The schedule's name, with its seed unless the name says it ("seed-4711")."""
    name = str(row[ts.SCHEDULE] or row[ts.ROUND])
    seed = row[ts.SEED]
    return name if seed is None or str(seed) in name else f"{name} (seed {seed})"


def _schedule_cell(row: Row) -> str:
    """The schedule's name; hovering shows the round id (run and schedule) and the file."""
    return (f'<span title="{escape(str(row[ts.ROUND]))}: {escape(str(row["file"]))}">'
            f"{escape(_schedule_name(row))}</span>")


def _unbroken(faults: object) -> str:
    """A comma-separated list that wraps only after its commas (non-breaking hyphens)."""
    return escape(str(faults or "–")).replace("-", "\u2011")


def _checks_cell(checks: object, mismatched: object) -> object:
    """E.g. "3", or "1 of 3" in red if one of three checks found a mismatch."""
    if mismatched:
        return f'<span class="bad">{mismatched} of {checks}</span>'
    return str(checks)


def _nemesis(data: DashboardData) -> str:
    intro = (
        "<p>One row per nemesis round (a schedule of <code>python -m tests.nemesis</code>): "
        "the total-queue checker over the clients' history and the replica comparisons. "
        "<b>Verdict</b>, as the nemesis prints it: <b>ok</b>; <b>INVALID</b>: a message lost "
        "(acknowledged, never received) or unexpected (received, never sent); <b>MISMATCH</b>: "
        "a ready backup's copy of a queue differed from the primary's; <b>NO VERDICT</b>: the "
        "queue was not drained, so <i>lost</i> counts acknowledged messages not received, not "
        "proven lost. <i>Duplicated</i>: ids received more than once (allowed); "
        "<i>recovered</i>: received though never acknowledged (allowed). <i>Checks</i>: replica "
        "comparisons run (in red: how many of them found a mismatch). Failing rounds first, "
        "in red; nemesis.csv has every column.</p>"
    )
    rejected = _rejected_nemesis(data)
    rejected_note = (f"<p>{_count(rejected, 'nemesis round')} rejected (see "
                     '<a href="#input-problems">Input problems</a>): not shown here.</p>'
                     if rejected else "")
    if not data.nemesis:
        return ("<p>No nemesis round in these traces (<code>python -m tests.nemesis</code> "
                "writes them).</p>" + rejected_note)
    rows = data.nemesis
    counts = _verdict_counts(rows)
    failing = sum(1 for r in rows if r[nm.FAILING])

    def total(column: str) -> int:
        return sum(r[column] or 0 for r in rows)

    totals = _table(
        ["nemesis rounds", "failing", *ts.VERDICTS, "acknowledged", "lost", "unexpected",
         "duplicated", "recovered", "mismatches", "checks", "ops (not ok)"],
        [[str(len(rows)), _n(failing, True),
          *[_n(counts[v], v != ts.VERDICT_OK) for v in ts.VERDICTS],
          str(total(ts.ACKNOWLEDGED)), _n(total(ts.LOST), True), _n(total(ts.UNEXPECTED), True),
          str(total(ts.DUPLICATED)), str(total(ts.RECOVERED)),
          _n(total(ts.REPLICA_MISMATCHES), True),
          _checks_cell(total(ts.REPLICA_CHECKS), total(nm.MISMATCHED_CHECKS)),
          (_ops_cell({nm.OPS: total(nm.OPS), **{c: total(c) for c in nm.OPS_BY_OUTCOME.values()}}),
           "wrap")]],
        text_columns=0, text_at={13}, total_rows=[True],
        groups=[("rounds", 2 + len(ts.VERDICTS)), ("messages (checker)", 5), ("replicas", 2),
                ("", 1)],
    )
    ordered = sorted(rows, key=lambda r: (not r[nm.FAILING], str(r[ts.ROUND])))
    shown = ordered[:NEMESIS_ROWS_SHOWN]
    table = _table(
        ["schedule", "verdict", "acknowledged", "lost", "unexpected", "duplicated", "recovered",
         "mismatches", "checks", "ops (not ok)", "faults"],
        [[_schedule_cell(r),
          (f'<span class="bad">{escape(r[nm.VERDICT])}</span>' if r[nm.FAILING]
           else escape(r[nm.VERDICT])),
          str(r[ts.ACKNOWLEDGED]),
          _n(r[ts.LOST], True),
          _n(r[ts.UNEXPECTED], True),
          str(r[ts.DUPLICATED]),
          str(r[ts.RECOVERED]),
          _n(r[ts.REPLICA_MISMATCHES], True),
          _checks_cell(r[ts.REPLICA_CHECKS], r[nm.MISMATCHED_CHECKS]),
          (_ops_cell(r), "wrap"),
          (_unbroken(r[nm.FAULTS_TEXT]), "wrap")]
         for r in shown],
        text_columns=2, text_at={9, 10}, bad_rows=[bool(r[nm.FAILING]) for r in shown],
        groups=[("", 2), ("messages (checker)", 5), ("replicas", 2), ("", 2)],
    )
    note = ("" if len(shown) == len(ordered) else
            f"<p>The first {len(shown)} of {len(ordered)} rounds; nemesis.csv has all.</p>")
    return intro + rejected_note + totals + table + note + _failing_details(ordered)


def _ids(text: object) -> str:
    ids = str(text or "").split()
    more = " …" if len(ids) > IDS_SHOWN else ""
    return escape(" ".join(ids[:IDS_SHOWN])) + more


def _failing_details(rows: Sequence[Row]) -> str:
    """What went wrong in each failing round, in words."""
    items = []
    for r in rows:
        if not r[nm.FAILING]:
            continue
        why = []
        if not r[ts.DRAIN_COMPLETE]:
            why.append("the queue was not drained (no verdict)")
        if r[ts.LOST]:
            why.append(f"lost {r[ts.LOST]}"
                       + (f": {_ids(r[ts.LOST_IDS])}" if r[ts.LOST_IDS] else ""))
        if r[ts.UNEXPECTED]:
            why.append(f"unexpected {r[ts.UNEXPECTED]}"
                       + (f": {_ids(r[ts.UNEXPECTED_IDS])}" if r[ts.UNEXPECTED_IDS] else ""))
        if r[ts.REPLICA_MISMATCHES]:
            why.append(f"{r[ts.REPLICA_MISMATCHES]} replica mismatches in "
                       f"{r[nm.MISMATCHED_CHECKS]} of {_count(r[ts.REPLICA_CHECKS], 'check')}")
        items.append(
            f"<li><b>{escape(_schedule_name(r))}</b>: "
            f'<span class="bad">{escape(r[nm.VERDICT])}</span>: {"; ".join(why)} '
            f"<small>({escape(str(r[ts.ROUND]))}, {escape(str(r['file']))})</small></li>"
        )
    if not items:
        return ""
    return f'<h3>Failing rounds</h3><ul class="failing">{"".join(items)}</ul>'


def _fault_types(data: DashboardData) -> str:
    if not data.fault_types:
        return "<p>No round to count.</p>"
    intro = (
        "<p>How often each fault type was <b>injected</b> (an op whose result is <code>ok</code>) "
        "and in how many rounds: every op of the nemesis rounds (a partition named by its kind) "
        "and the fault of every other round (once per round). <i>Failing rounds</i>: nemesis "
        "rounds whose verdict is not ok and other rounds that lost an acknowledged message. "
        "Ops that did not take effect, by result: <i>refused</i> (the node refused, e.g. a "
        "promotion), <i>skipped</i> (the nemesis's rules, or the target was down or unbound), "
        "<i>timeout</i> (a wait ran out), <i>failed</i> (a node exited unasked during the op); "
        "<i>MISMATCH</i>: a check that found different replicas. Recovery ops undo faults; "
        "checks compare the replicas (<code>elect_each</code>: every node elected in turn). "
        "fault_types.csv has the rows below (a result column only shows if some op had "
        "it).</p>"
    )
    charted = [r for r in data.fault_types if r[nm.ROLE] in (ts.ROLE_FAULT, ts.ROLE_RECOVERY)]
    chart = ""
    if charted:
        chart = svg.stacked_bars(
            "Injections per fault type, in passing and failing rounds",
            ["in passing rounds", "in failing rounds"], INJECTION_COLORS,
            [(str(r[nm.FAULT_TYPE]),
              [float(r[nm.INJECTED] - r[nm.INJECTED_IN_FAILING]), float(r[nm.INJECTED_IN_FAILING])])
             for r in charted],
            "injections",
        )
    every = list(data.fault_types)
    not_ok = {o: c for o, c in nm.NOT_OK.items() if any(r[c] for r in every)}
    headers = ["fault type", "role", "injected", "rounds", "nemesis rounds", "failing rounds",
               "injected in failing rounds", *not_ok]
    totals = {r[nm.ROLE]: r for r in data.fault_role_totals}
    rows, total_rows = [], []
    for role in ts.ROLES:
        group = [r for r in data.fault_types if r[nm.ROLE] == role]
        if not group:
            continue
        for r in group + ([totals[role]] if role in totals and len(group) > 1 else []):
            rows.append([
                escape(str(r[nm.FAULT_TYPE])),
                escape(ROLE_LABELS.get(role, role)),
                str(r[nm.INJECTED]),
                str(r[nm.ROUNDS]),
                _n(r[nm.NEMESIS_ROUNDS], grey_zero=True),
                _n(r[nm.FAILING_ROUNDS], True, True),
                _n(r[nm.INJECTED_IN_FAILING], True, True),
                *[_n(r[c], o in ("failed", ts.RESULT_MISMATCH), True)
                  for o, c in not_ok.items()],
            ])
            total_rows.append(r is totals.get(role))
    groups = [("", 7)] + ([("ops that did not take effect", len(not_ok))] if not_ok else [])
    return intro + chart + _table(headers, rows, text_columns=2, total_rows=total_rows,
                                  groups=groups)


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
        "nemesis": _nemesis(data),
        "fault-types": _fault_types(data),
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
