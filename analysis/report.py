"""`replay report`: one self-contained HTML page (plots embedded as base64 PNG, no network
needed) of results files and results sets, with each plot also written as a PNG next to it.

Inputs are grouped by target (their label); two targets with sets and runs get the verdict.
"""
import base64
import html
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from analysis import act_chart, bench_charts, plots, score_labels
from analysis.compare import target_label
from analysis.histogram import LatencyHistogram, bin_lower
from analysis.results import Results, ResultsError, ResultsSet, load
from analysis.suite import score_set
from analysis.timeseries import SECOND_NS, time_series
from analysis.verdict import SYNTHETIC_SCORES, VerdictError, _ratio, _secs, mode_label, verdict
from traces.schema import Op

SCATTER_POINTS = 20_000  # per results file: enough to see the bands, small enough to draw
HEAT_CELLS = (120, 64)  # time x offset


@dataclass
class _Item:
    path: Path
    label: str
    loaded: Results | ResultsSet
    repeat: str = ""  # what tells this input from another of its test or trace on its target

    @property
    def partial(self) -> bool:
        return self.loaded.interrupted

    @property
    def tag(self) -> str:
        """Legend entry: target label and trace or test, marked when partial."""
        return f"{self.label}: {self.loaded.name}{self.repeat}" + (" (partial)" if self.partial else "")


def _tell_apart(items) -> None:
    """Two inputs of one test or trace on one target would share a legend entry, and the
    second replace the first in every chart: each is told apart by its file or directory
    name, or numbered where those are the same too."""
    count = {}
    for it in items:
        count[it.tag] = count.get(it.tag, 0) + 1
    taken = set()
    for it in items:
        if count[it.tag] > 1:
            it.repeat = f" ({it.path.name})"
            n, base = 1, it.repeat
            while it.tag in taken:
                n += 1
                it.repeat = f"{base[:-1]} #{n})"
        taken.add(it.tag)


@dataclass
class _FileFigures:
    cdf: dict = field(default_factory=dict)  # op name -> (latency_ns, share)
    sample: tuple = ((), ())
    ts: object = None


def _target_label(loaded) -> str:
    return target_label(loaded.target, str(loaded.target.get("kind") or "target"))


def _analyse_file(r: Results, bin_ns: int) -> _FileFigures:
    """One streaming pass for the CDFs and the latency sample, one for the time series."""
    hists = {op: LatencyHistogram() for op in Op}
    stride = max(1, r.rows // SCATTER_POINTS)
    t_sample, lat_sample = [], []
    seen = 0
    for chunk in r.chunks(["op", "intended_ns", "issue_ns", "complete_ns"]):
        issued = chunk["issue_ns"] >= 0
        workload = chunk["complete_ns"] - np.minimum(chunk["intended_ns"], chunk["issue_ns"])
        for op in Op:
            sel = issued & (chunk["op"] == op)
            if sel.any():
                hists[op].add(workload[sel])
        first = (-seen) % stride
        idx = np.arange(first, len(workload), stride)
        idx = idx[issued[idx]]
        t_sample.append(chunk["complete_ns"][idx] / SECOND_NS)
        lat_sample.append(workload[idx])
        seen += len(workload)
    out = _FileFigures()
    for op, h in hists.items():
        if h.count:
            nz = np.flatnonzero(h.counts)
            lower = np.array([int(bin_lower(int(i))) for i in nz], dtype=np.int64)
            lower[0] = max(lower[0], h.min)
            out.cdf[op.name.lower()] = (lower, np.cumsum(h.counts[nz]) / h.count)
    out.sample = (np.concatenate(t_sample), np.concatenate(lat_sample))
    out.ts = time_series(r.chunks(["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"]), bin_ns)
    return out


def _cdf_panels(files, analysed) -> tuple[dict, dict]:
    """({trace: {target: {op: curve}}} for plots.latency_cdf, {curve key: target label}); a
    repeat run of a trace on one target is numbered, a partial run marked."""
    panels, label_of = {}, {}
    for it in files:
        curves = panels.setdefault(it.loaded.name, {})
        key, n = it.label, 1
        while key in curves or f"{key} (partial)" in curves:
            n += 1
            key = f"{it.label} #{n}"
        key += " (partial)" if it.partial else ""
        curves[key] = analysed[id(it)].cdf
        label_of[key] = it.label
    return panels, label_of


def _heatmap(r: Results):
    """I/O counts on a time x offset grid, over the trace's span (two streaming passes)."""
    t_max, off_max, ts_max = 1, 1, 0
    for chunk in r.chunks(["offset", "length", "issue_ns", "ts_ns"]):
        issued = chunk["issue_ns"] >= 0
        if issued.any():
            t_max = max(t_max, int(chunk["issue_ns"][issued].max()) + 1)
            ts_max = max(ts_max, int(chunk["ts_ns"].max()))
            off_max = max(off_max, int((chunk["offset"] + chunk["length"]).max()))
    # The trace's own clock when it has one; a closed-loop trace (every ts_ns 0) by issue time.
    clock = "ts_ns" if ts_max > 0 else "issue_ns"
    t_max = ts_max + 1 if ts_max > 0 else t_max
    t_edges = np.linspace(0, t_max, HEAT_CELLS[0] + 1)
    o_edges = np.linspace(0, off_max, HEAT_CELLS[1] + 1)
    counts = np.zeros(HEAT_CELLS, dtype=np.int64)
    for chunk in r.chunks(["offset", "issue_ns", clock]):
        issued = chunk["issue_ns"] >= 0
        h, _, _ = np.histogram2d(chunk[clock][issued], chunk["offset"][issued], bins=(t_edges, o_edges))
        counts += h.astype(np.int64)
    return counts, t_edges / SECOND_NS, o_edges, clock


def auto_window_ns(duration_ns: int) -> int:
    """A 1-2-5 window giving at least ~100 windows over `duration_ns`, at most one second
    (the reviews' per-second pictures) and at least 1 ms."""
    target = max(duration_ns / 100, 1e6)
    for w in (1e6, 2e6, 5e6, 1e7, 2e7, 5e7, 1e8, 2e8, 5e8):
        if w >= target:
            return int(w)
    return SECOND_NS


def _is_synthetic(loaded) -> bool:
    """A results set, or a closed-loop replay of a generated test (not the synthetic demo,
    which stands in for a real workload)."""
    if isinstance(loaded, ResultsSet):
        return True
    kind = str(((loaded.trace.get("metadata") or {}).get("source") or {}).get("kind", ""))
    return loaded.closed_loop and kind.startswith("synth:") and kind != "synth:demo"


def _fmt_ns(ns) -> str:
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "-"
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} us"


def _table(header, rows, cls="") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{f' class={cls!r}' if cls else ''}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _status(item) -> str:
    return '<span class="partial">partial (interrupted)</span>' if item.partial else "complete"


def _summary_rows(files) -> list:
    rows = []
    for item in files:
        r = item.loaded
        s = r.summary
        lat = s.total().workload
        p50, p99 = lat.percentiles([50.0, 99.0])
        rows.append([html.escape(item.label), html.escape(r.name), _mode(r), f"{s.total().ios:,}",
                     _fmt_ns(s.duration_ns), f"{s.iops():,.0f}", f"{s.mb_per_s():,.1f}",
                     _fmt_ns(p50), _fmt_ns(p99), _fmt_ns(lat.max), _status(item)])
    return rows


def _mode(r) -> str:
    """How a replay was timed: "afap QD32", "timed x2" (open loop at a speed) or "causal"."""
    run = r.run
    if run.get("mode") == "causal":
        scale = run.get("think_scale")
        return "causal" + (f", think x{scale:g}" if scale not in (None, 1) else "")
    return f"afap QD{run.get('qd')}" if r.closed_loop else f"timed x{r.speed:g}"


def _score_words(test: str, scores: dict) -> list[str]:
    """A results set's numeric scores in words (analysis.score_labels, the one table): "70/30
    QD32: 33,220 IOPS", the verdict's score first; lists and tables are left to the plots."""
    out, seen = [], set()
    known = SYNTHETIC_SCORES.get(test)
    if known and isinstance(scores.get(known[0]), (int, float)):
        key, label, unit = known
        out.append(f"{label}: {score_labels.value_words(scores[key], unit)}")
        seen.add(key)
    for key, v in score_labels.numeric(scores).items():
        if key not in seen:
            out.append(score_labels.words(key, v) or f"{key}: {score_labels.number(v)}")
    passed = scores.get("passed")
    if isinstance(passed, bool):
        out.append("passed" if passed else "failed")
    ss = scores.get("steady_state") or scores.get("iops_steady_state")
    if isinstance(ss, dict) and "reached" in ss:
        out.append(f"SNIA steady state reached at round {ss.get('round')}" if ss["reached"]
                   else f"SNIA steady state: {ss.get('status', 'not reached')}")
    return out


def _set_rows(sets) -> list:
    rows = []
    for item in sets:
        words = _score_words(item.loaded.test, item.loaded.scores)
        rows.append([html.escape(item.label), html.escape(item.loaded.test), str(len(item.loaded.runs)),
                     "<div class='words'>" + "<br>".join(html.escape(w) for w in words) + "</div>" if words else "-",
                     _status(item)])
    return rows


def _suite_html(item) -> str:
    """A suite's table, as `replay suite` prints it, for its target."""
    s = score_set(item.loaded)
    rows = [[html.escape(w.name) + (' <span class="partial">(partial)</span>' if w.partial else ""),
             _fmt_ns(w.run_time_ns), "-" if w.run_time_ratio is None else f"{w.run_time_ratio:.2f}x",
             f"{w.data_rate / 1e6:,.1f}", _fmt_ns(w.read.mean_ns), _fmt_ns(w.read.p99_ns),
             _fmt_ns(w.write.mean_ns), _fmt_ns(w.write.p99_ns)] for w in [*s.workloads, s.overall]]
    score = "-" if s.composite is None else score_labels.number(s.composite)
    return (f"<h3>{html.escape(item.label)}, {html.escape(s.timing)} timing</h3>"
            + _table(["workload", "run time", "vs capture", "MB/s", "read avg", "read p99", "write avg",
                      "write p99"], rows)
            + f"<p>Composite (ours, PCMark-style: the geometric mean over the workloads of MB/s and of "
              f"1 / average access time in ms; see docs/suite.md): <b>{score}</b></p>")


def _verdict_html(v) -> str:
    """The verdict as HTML tables: the synthetic scores, then real use per workload, then its
    sentences; the same figures as `replay verdict` prints."""
    a, b = html.escape(v.label_a), html.escape(v.label_b)
    synth = _table(["synthetic test", f"A: {v.label_a}", f"B: {v.label_b}", "B / A"], [
        [html.escape(s.label) + (" (partial)" if s.partial else ""),
         f"{score_labels.number(s.a)} {html.escape(s.unit)}", f"{score_labels.number(s.b)} {html.escape(s.unit)}", _ratio(s.ratio)]
        for s in v.synthetic], "one-name") if v.synthetic else \
        f"<p>No synthetic test: {html.escape(v.faster)} is the faster over the workloads.</p>"
    rows = []
    for w in v.workloads:
        partial = w.a.partial or w.b.partial
        rows.append([html.escape(w.name) + (' <span class="partial">(partial)</span>' if partial else ""),
                     mode_label(w), _secs(w.a.wait_ns), _secs(w.b.wait_ns),
                     _ratio(w.wait_ratio), _secs(w.a.p99_ns), _secs(w.b.p99_ns), _ratio(w.p99_ratio),
                     _ratio(w.finish_ratio) if w.finish_ratio else "-",
                     "-" if w.share is None else f"{w.share * 100:.0f} %", f"<b>{html.escape(w.answer)}</b>"])
    real = _table(["workload", "mode", "waited A", "waited B", "A / B", "p99 A", "p99 B", "A / B",
                   "finish A / B", "share", "answer"], rows, "verdict-real")
    out = [f"<p>A = {a}, B = {b}. Synthetic ratios are B / A; real-use ratios A / B: above 1x, B "
           "is better. Waited: the time the workload waited on storage (sum of completion - "
           "intended); share: how much of the synthetic advantage shows, on a log scale.</p>",
           synth, real, "<ul class='verdict'>" + "".join(f"<li>{html.escape(w.sentence)}</li>"
                                                         for w in v.workloads) + "</ul>"]
    if v.run_time_sentence():
        out.append(f"<p><b>{html.escape(v.run_time_sentence())}</b></p>")
    if any(w.a.partial or w.b.partial for w in v.workloads):
        out.append("<p class='partial'>partial: an interrupted run; compared over the I/Os both runs did.</p>")
    out += [f"<p class='note'>{html.escape(n)}</p>" for n in v.notes]
    return "\n".join(out)


_CSS = """
body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}
th{background:#eee}td:first-child,td:nth-child(2),th:first-child{text-align:left}
.one-name td:nth-child(2){text-align:right}
.words{text-align:left}.verdict li{margin:.3em 0}
.partial{color:#b00;font-weight:bold}.note{color:#555}figure{margin:1.5em 0}
img{max-width:100%;border:1px solid #ddd}pre{background:#f6f6f6;padding:1em;overflow-x:auto}
"""


def _steady_passes(it) -> list:
    """(label, scores) per pass of a steady results set: one, or with `replay bench --op`
    passes each under its own label, as seed 003's page draws Default and 25% Over-Provisioning
    side by side (the first pass's scores are the set's, a later one's under scores["opP"])."""
    sc = it.loaded.scores
    passes = it.loaded.metadata.get("op") or []
    if len(passes) < 2 and not any(p.get("op") for p in passes):
        return [(it.tag, sc)]
    return [(f"{it.tag}, " + (f"{p['op']} % over-provisioning" if p["op"] else "default capacity"),
             sc if p.get("scores") is None else sc.get(p["scores"]) or {}) for p in passes]


CONSISTENCY_WORDS = ("consistency is the average of the per-second IOPS in the scored window over "
                     "their standard deviation, as seed 003 scores it; seed 002 charts consistency "
                     "without stating its formula, so for seed 002 this one is assumed")


def _bench_figures(sets) -> list:
    """The reviews' own pictures of bench results sets (analysis.bench_charts gives their
    numbers): the mix sweeps in IOPS and in MB/s with the 70/30 and six-mix bars beside them,
    single points as one bar chart per test, steady's scored window, rounds, IOPS per second,
    latency distribution and QD scaling."""
    figures, mix, mb, seq, window, scaling, rounds, series, ranges = [], {}, {}, {}, {}, {}, {}, {}, {}
    for it in sets:
        sc, test = it.loaded.scores, it.loaded.test
        if test == "mix" and sc.get("table"):
            mix[it.tag] = sc["table"]
        if test in ("mix", "steady") and sc.get("table"):
            mb[it.tag] = sc["table"]
        if test == "seqmix" and sc.get("table"):
            seq[it.tag] = sc["table"]
        for label, ps in _steady_passes(it) if test == "steady" else ():
            rr = (ps.get("steady_state") or {}).get("rounds") or []
            # Each round's own average (its value), not the 5-round window's rolling average.
            values = ps.get("round_iops") or [r.get("iops", r.get("value")) if isinstance(r, dict)
                                              else r for r in rr]
            values = [v for v in values if isinstance(v, (int, float))]
            if values:
                rounds[label] = np.array(values, dtype=float)
            if ps.get("iops_series"):
                y = np.array(ps["iops_series"], dtype=float)
                series[label] = (np.arange(len(y), dtype=float), y)
                if ps.get("window_s"):
                    window[label] = (np.arange(len(y), dtype=float), y, float(ps["window_s"]))
            if ps.get("qd_scaling"):
                scaling[label] = ps["qd_scaling"]
            if ps.get("latency_distribution"):
                ranges[label] = bench_charts.latency_ranges(ps["latency_distribution"])
    iops = bench_charts.sweep_chart(mix, "iops")
    if iops.lines:
        figures.append(("mix_sweep", "The random mix sweep: IOPS at each read share, one line per "
                        "queue-depth split and data pattern.", plots.mix_sweep(iops)))
    if rounds:
        figures.append(("steady_rounds", "Steady-state rounds: average IOPS of each round.",
                        plots.steady_rounds(rounds)))
    if series:
        figures.append(("steady_iops", "Steady-state test: IOPS per second (the consistency picture).",
                        plots.over_time(series, "Steady state: IOPS over time", "IOPS", scatter=True)))
    for name, test, tables, title, what in (
            ("mix_sweep_mb", "mix", mb, "4 KiB random mixes: MB/s", "4 KiB random"),
            ("seqmix_sweep", "seqmix", seq, "128 KiB sequential mixes: MB/s", "128 KiB sequential")):
        chart = bench_charts.sweep_chart(tables)
        if chart.lines:
            bars = " and ".join(b for b, have in (("the 70/30 headline (seed 000)", chart.headline),
                                                  ("the average of the six mixes (seed 001)",
                                                   chart.average)) if have)
            figures.append((name, f"{title}, as the reviews draw them" + (f", with {bars}" if bars else "")
                            + ".", plots.sweep_mb(chart, title)))
        for point in bench_charts.point_charts(tables, what):
            figures.append((f"{test}_{point.name}", f"{point.title}: one test of single points, "
                            f"average {point.unit} per target and data pattern (seed 004's bars).",
                            plots.point_bars(point)))
    if window:
        figures.append(("steady_window", "The scored window of the steady-state test, zoomed: IOPS "
                        f"per second and their average; {CONSISTENCY_WORDS}.", plots.scored_window(window)))
    if ranges:
        figures.append(("latency_distribution", "Share of the scored window's I/Os per device-latency "
                        "range (seed 002's latency distribution); the last range, over 10 ms, is the "
                        "consistency warning. The ranges are ours: the page does not give them.",
                        plots.latency_distribution(ranges)))
    if scaling:
        figures.append(("qd_scaling", "Queue-depth scaling after the steady-state run.",
                        plots.qd_scaling(scaling)))
    return figures


POWER_TESTS = ("mix", "steady", "act")  # the tests whose power the pages chart


def _power_figures(sets) -> tuple[list, list]:
    """(figures, notes) of the pages' power charts, for the sets run with --power-log: the mix
    sweeps' average power and efficiency per point with the 70/30 bar (seed 000), steady's
    scored window (seed 002's 70/30 efficiency) and ACT at its passing multiple (seed 000).
    Without power in any set there are none, silently; a set of those tests without power
    beside others with it is named in one note."""
    measured = [it for it in sets if it.loaded.test in POWER_TESTS]
    powered = [it for it in measured if bench_charts.has_power(it.loaded.metadata.get("runs") or [])]
    if not powered:
        return [], []
    notes = []
    missing = [it.tag for it in measured if it not in powered]
    if missing:
        notes.append(f"No power chart for {', '.join(missing)}: run without --power-log.")
    figures, tables, steady, act = [], {}, {}, {}
    for it in powered:
        sc, meta = it.loaded.scores, it.loaded.metadata
        if it.loaded.test == "mix" and sc.get("table"):
            first = (meta.get("op") or [{}])[0].get("op") or 0
            tables[it.tag] = bench_charts.with_power(sc["table"], meta["runs"],
                                                     f"op{first}-" if first else "")
        if it.loaded.test == "steady":
            steady.update(_steady_passes(it))
        if it.loaded.test == "act":
            act[it.tag] = sc
    for value, name, title in (("average_w", "mix_power", "4 KiB random mixes: average power"),
                               ("mb_per_s_per_w", "mix_efficiency", "4 KiB random mixes: efficiency")):
        chart = bench_charts.sweep_chart(tables, value)
        if chart.lines:
            figures.append((name, f"{title} ({chart.unit}) at each read share, each point over its "
                            "whole run, with the 70/30 headline's bar (seed 000's tabs).",
                            plots.sweep_mb(chart, f"{title} ({chart.unit})")))
    for name, chart, caption in (
            ("steady_power", bench_charts.steady_power_bars(steady),
             "The steady-state test's efficiency (its scored window's MB/s over the window's "
             "average power) and average power, as seed 002's 70R/30W efficiency."),
            ("act_power", bench_charts.act_power_bars(act),
             "Aerospike ACT's efficiency and average power over the run at each target's passing "
             "multiple (seed 000); a target that passed none has no bar.")):
        if chart.bars:
            figures.append((name, caption, plots.power_bars(chart)))
    return figures, notes


def _looks(files, colours) -> dict:
    """{tag: look} of each results file: its target's colour, and a line style and marker per
    trace among that target's, so that a colour means one target in every plot."""
    looks, seen = {}, {}
    for it in files:
        n = seen[it.label] = seen.get(it.label, -1) + 1
        looks[it.tag] = {"color": colours[it.label], "linestyle": plots.LINE_STYLES[n % len(plots.LINE_STYLES)],
                         "marker": plots.MARKERS[n % len(plots.MARKERS)]}
    return looks


def _file_figures(files, bin_ns, colours) -> list:
    """(name, caption, Figure) of the plots of results files; `colours`: {target label: colour}."""
    analysed = {id(it): _analyse_file(it.loaded, bin_ns) for it in files}
    looks = _looks(files, colours)
    panels, label_of = _cdf_panels(files, analysed)
    figures = [("latency_cdf", "Workload latency (completion - intended) as a CDF: one panel "
                "per trace, a colour per target, a line style per op.",
                plots.latency_cdf(panels, colours={key: colours[label] for key, label in label_of.items()}))]
    ts = {it.tag: analysed[id(it)].ts for it in files}
    window = f"{bin_ns / 1e9:g} s" if bin_ns >= 1e8 else f"{bin_ns / 1e6:g} ms"
    figures.append(("iops_over_time", f"IOPS per {window} window over time (each dot one window).",
                    plots.over_time({k: (t.t_s, t.iops["all"]) for k, t in ts.items()},
                                    "IOPS over time", "IOPS", log=True, scatter=True, looks=looks)))
    lat, lat_looks = {}, {}
    for k, t in ts.items():
        for q, width in (("p50", 0.8), ("p99", 1.6)):  # a target's colour; p99 the heavier line
            lat[f"{k} {q}"] = (t.t_s, t.workload[q] / plots.NS_PER_MS)
            lat_looks[f"{k} {q}"] = {**looks[k], "linewidth": width}
    figures.append(("latency_over_time", "Workload latency p50 (thin) and p99 (thick) per window.",
                    plots.over_time(lat, "Latency over time", "workload latency (ms)", log=True, looks=lat_looks)))
    figures.append(("latency_scatter", f"Latency of individual I/Os (up to {SCATTER_POINTS:,} per run, evenly sampled).",
                    plots.latency_scatter({it.tag: analysed[id(it)].sample for it in files}, looks=looks)))
    figures.append(("inflight", "Mean I/Os in flight per window.",
                    plots.over_time({k: (t.t_s, t.inflight) for k, t in ts.items()},
                                    "I/Os in flight over time", "I/Os in flight", looks=looks)))
    return figures


def build_report(paths, output, labels=None, bin_ns: int | None = None) -> Path:
    """Write the report for `paths` (results files and results-set directories) to `output`
    and its plots to OUTPUT_STEM_files/NAME.png. `labels` names each input's target (default:
    the target's path); inputs with the same label are the same target. `bin_ns` is the
    time-series window (default: auto_window_ns of the longest run). Returns the HTML path."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ResultsError("no results given; pass results files of `replay run` or directories of `replay bench`")
    if labels and len(labels) != len(paths):
        raise ResultsError(f"{len(labels)} labels for {len(paths)} inputs; give one --label per input, in order")
    items, suites = [], []
    for i, p in enumerate(paths):
        loaded = load(p)
        label = labels[i] if labels else _target_label(loaded)
        if isinstance(loaded, ResultsSet) and loaded.suite:  # its workloads, as results files
            suites.append(_Item(p, label, loaded))
            items += [_Item(run.path, label, run) for run in loaded.measured()]
        else:
            items.append(_Item(p, label, loaded))
    _tell_apart(items)
    output = Path(output)
    files_dir = output.with_name(output.stem + "_files")
    files_dir.mkdir(parents=True, exist_ok=True)
    files = [it for it in items if isinstance(it.loaded, Results)]
    sets = [it for it in items if isinstance(it.loaded, ResultsSet)]
    figures = []  # (name, caption, Figure)
    if files and bin_ns is None:
        bin_ns = auto_window_ns(max(it.loaded.summary.duration_ns for it in files))
    bin_ns = bin_ns or SECOND_NS
    targets = list(dict.fromkeys(it.label for it in items))
    colours = plots.target_colours(targets)
    if files:
        figures += _file_figures(files, bin_ns, colours)
        done = set()
        for it in files:
            if it.loaded.name in done:
                continue
            done.add(it.loaded.name)
            counts, t_edges, o_edges, clock = _heatmap(it.loaded)
            safe = "".join(c if c.isalnum() else "_" for c in it.loaded.name)
            figures.append((f"heatmap_{safe}", f"Where trace {it.loaded.name} goes over time (as replayed on {it.label}).",
                            plots.offset_heatmap(counts, t_edges, o_edges, f"Offsets of {it.loaded.name} over time",
                                                trace_clock=clock == "ts_ns")))
    figures += _bench_figures(sets)
    figures += act_chart.report_figures(sets, colours)
    power_figures, power_notes = _power_figures(sets)
    figures += power_figures

    verdict_html, notes = "", list(power_notes)
    if len(targets) == 2:
        # Results sets are the synthetic side; without any, closed-loop runs of generated tests.
        synthetic = sets or [it for it in files if _is_synthetic(it.loaded)]
        side = {t: ([it.path for it in synthetic if it.label == t],
                    [it.path for it in files if it.label == t and it not in synthetic]) for t in targets}
        (sa, fa), (sb, fb) = side[targets[0]], side[targets[1]]
        try:
            v = verdict(sa, sb, fa, fb, targets[0], targets[1])
            question = "the synthetic advantage" if v.synthetic else "the faster target's advantage"
            verdict_html = f"<h2>Verdict: does {question} show up in real use?</h2>" + _verdict_html(v)
        except VerdictError as e:
            notes.append(f"No verdict table: {e}")

    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>tracereplay report</title>"
             f"<style>{_CSS}</style></head><body><h1>tracereplay report</h1>",
             f"<p class='note'>Made {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from "
             f"{len(items)} input(s); targets: {html.escape(', '.join(targets))}.</p>"]
    if any(it.partial for it in items):
        parts.append("<p class='partial'>Some results come from interrupted runs: they are shown, "
                     "marked partial, and cover only the I/Os done before the stop.</p>")
    if files:
        parts.append("<h2>Replays</h2>" + _table(
            ["target", "trace", "mode", "I/Os", "duration", "IOPS", "MB/s", "p50 latency",
             "p99 latency", "max latency", "status"], _summary_rows(files)))
    if suites:
        parts.append("<h2>Real-use suite</h2>" + "".join(_suite_html(it) for it in suites))
    if sets:
        parts.append("<h2>Synthetic tests</h2>" + _table(["target", "test", "runs", "scores", "status"], _set_rows(sets)))
    parts.append(verdict_html)
    parts += [f"<p class='note'>{html.escape(n)}</p>" for n in notes]
    parts.append("<h2>Plots</h2>")
    for name, caption, fig in figures:
        png = plots.png_bytes(fig)
        (files_dir / f"{name}.png").write_bytes(png)
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure id='{name}'><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{html.escape(caption)} <a href='{files_dir.name}/{name}.png'>PNG</a>"
                     "</figcaption></figure>")
    parts.append("</body></html>")
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    os.replace(tmp, output)
    return output
