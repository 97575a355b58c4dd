"""The report's plots, drawn with matplotlib's Agg backend from plain arrays: each function takes
{label: data} for one or more targets and returns a Figure; `png_bytes` renders one.
Axes carry units, legends name the targets, latency axes are logarithmic.
"""
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

NS_PER_MS = 1e6
_SIZE = (8.0, 4.2)
_DPI = 100


def _figure(title: str):
    fig, ax = plt.subplots(figsize=_SIZE, dpi=_DPI, layout="constrained")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _legend(ax, **kwargs):
    """A legend inside the axes, or beside them when it has too many entries to fit, with
    20 distinct colours instead of the default 10 then."""
    n = len(ax.get_legend_handles_labels()[1])
    if n > 6:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1),
                  borderaxespad=0, **kwargs)
    else:
        ax.legend(fontsize="small", **kwargs)


def _colours(ax, n):
    if n > 10:
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)


def target_colours(targets) -> dict:
    """One colour per target (tab10, or tab20 past ten), for every plot of a report to share."""
    palette = plt.get_cmap("tab10" if len(targets) <= 10 else "tab20").colors
    return {t: palette[i % len(palette)] for i, t in enumerate(targets)}


# How the series of one target tell apart in a plot where a colour is a target.
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def latency_cdf(panels: dict[str, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]],
                title="Workload latency CDF", colours: dict | None = None):
    """`panels`: {trace: {target: {op: (latency_ns ascending, cumulative share 0..1)}}}; one
    panel per trace, a colour per target (the same in every panel; `colours` gives them), a
    line style per op; log x in ms, on one scale across panels so they compare at a glance."""
    targets = list(dict.fromkeys(t for curves in panels.values() for t in curves))
    ops = list(dict.fromkeys(op for curves in panels.values() for c in curves.values() for op in c))
    colour = colours or target_colours(targets)
    style = {op: LINE_STYLES[i % len(LINE_STYLES)] for i, op in enumerate(ops)}
    n = max(len(panels), 1)
    cols = 1 if n == 1 else 2
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(_SIZE[0] if cols == 1 else 10.5, 1.2 + 3.0 * rows),
                             dpi=_DPI, layout="constrained", sharex=True, squeeze=False)
    fig.suptitle(title)
    lows = [float(lat[0]) for curves in panels.values() for c in curves.values()
            for lat, _ in c.values() if len(lat)]
    highs = [float(lat[-1]) for curves in panels.values() for c in curves.values()
             for lat, _ in c.values() if len(lat)]
    for ax, (trace, curves) in zip(axes.flat, panels.items()):
        ax.set_title(trace, fontsize="medium")
        ax.grid(True, which="both", alpha=0.3)
        for target, by_op in curves.items():
            for op, (lat_ns, share) in by_op.items():
                if len(lat_ns):
                    ax.step(np.maximum(lat_ns, 1) / NS_PER_MS, share * 100, where="post",
                            color=colour[target], linestyle=style[op], linewidth=1.4)
        ax.set_xscale("log")
        ax.set_ylim(0, 100.5)
        ax.set_ylabel("I/Os at or below (%)")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    if lows:
        axes.flat[0].set_xlim(max(min(lows), 1) / NS_PER_MS / 1.5, max(highs) / NS_PER_MS * 1.5)
    for ax in axes[-1]:
        ax.set_xlabel("latency (ms, log scale)")
        ax.xaxis.set_tick_params(labelbottom=True)
    if cols == 2 and n % 2:  # the last row's lone panel: label the empty slot's neighbour too
        axes[-2][1].set_xlabel("latency (ms, log scale)")
        axes[-2][1].xaxis.set_tick_params(labelbottom=True)
    handles = [Line2D([], [], color=colour[t], linewidth=2, label=t) for t in targets]
    handles += [Line2D([], [], color="#444", linestyle=style[op], label=op) for op in ops]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8),
               fontsize="small", frameon=False)
    return fig


def over_time(series: dict[str, tuple[np.ndarray, np.ndarray]], title: str, ylabel: str, *,
              log=False, scatter=False, looks: dict | None = None):
    """`series`: {label: (t_s, values)}; lines, or dots (the reviews' consistency pictures).
    `looks`: {label: {"color", "linestyle", "marker", "linewidth"}} for some series: lines
    take the colour, style and width, dots the colour and marker."""
    fig, ax = _figure(title)
    _colours(ax, len(series))
    for label, (t, y) in series.items():
        y = np.asarray(y, dtype=float)
        keep = np.isfinite(y) & ((y > 0) if log else True)
        look = (looks or {}).get(label, {})
        if scatter:
            ax.scatter(np.asarray(t)[keep], y[keep], s=6, label=label, color=look.get("color"),
                       marker=look.get("marker", "o"))
        else:
            few = keep.sum() < 20  # a short run: show its points, not an invisible line
            ax.plot(np.asarray(t)[keep], y[keep], label=label, color=look.get("color"),
                    linestyle=look.get("linestyle", "-"), linewidth=look.get("linewidth", 1.2),
                    marker=look.get("marker", "o") if few else None, markersize=3)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("time since the run's start (s)")
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""))
    if not log:
        ax.set_ylim(bottom=0)
    _legend(ax)
    return fig


def latency_scatter(points: dict[str, tuple[np.ndarray, np.ndarray]], title="Latency of each I/O",
                    looks: dict | None = None):
    """`points`: {label: (completion time s, latency ns)}, already sampled; log y in ms.
    `looks`: {label: {"color", "marker", ...}} for some series (as over_time's)."""
    fig, ax = _figure(title)
    _colours(ax, len(points))
    for label, (t, lat) in points.items():
        look = (looks or {}).get(label, {})
        ax.scatter(t, np.maximum(lat, 1) / NS_PER_MS, s=2, alpha=0.5, label=label, rasterized=True,
                   color=look.get("color"), marker=look.get("marker", "o"))
    ax.set_yscale("log")
    ax.set_xlabel("completion time since the run's start (s)")
    ax.set_ylabel("workload latency (ms, log scale)")
    _legend(ax, markerscale=4)
    return fig


def offset_heatmap(counts: np.ndarray, t_edges_s: np.ndarray, offset_edges: np.ndarray, title: str,
                   trace_clock: bool = True):
    """`counts[t, offset]` I/Os per cell; offsets in bytes, shown in GiB; log colour scale."""
    fig, ax = _figure(title)
    ax.grid(False)
    shown = np.where(counts > 0, counts, np.nan).T
    gib = offset_edges / (1 << 30)
    vmax = max(float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0, 1.0)
    mesh = ax.pcolormesh(t_edges_s, gib, shown, cmap="viridis", norm=LogNorm(vmin=1, vmax=vmax),
                         shading="flat")
    fig.colorbar(mesh, ax=ax, label="I/Os per cell (log scale)")
    ax.set_xlabel("time in the trace (s)" if trace_clock else "issue time since the run's start (s)")
    ax.set_ylabel("offset (GiB)")
    return fig


def mix_sweep(chart, title="Random mix sweep: IOPS by read share"):
    """`chart`: an analysis.bench_charts.SweepChart of IOPS; one line per target and sweep
    (queue-depth split and data pattern); log IOPS when they span decades."""
    fig, ax = _figure(title)
    _colours(ax, len(chart.lines))
    values = [y for _, ys in chart.lines.values() for y in ys]
    for name, (x, y) in chart.lines.items():
        ax.plot(np.array(x) * 100, y, marker="o", label=name)
    ax.set_xlabel("reads (% of I/Os)")
    if values and 0 < min(values) and max(values) > 20 * min(values):
        ax.set_yscale("log")
        ax.set_ylabel("IOPS (log scale)")
    else:
        ax.set_ylabel("IOPS")
        ax.set_ylim(bottom=0)
    _legend(ax)
    return fig


def steady_rounds(rounds: dict[str, np.ndarray], title="Steady-state rounds"):
    """`rounds`: {target label: average IOPS per round}."""
    fig, ax = _figure(title)
    for label, y in rounds.items():
        ax.plot(np.arange(1, len(y) + 1), y, marker="o", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("average IOPS of the round")
    ax.set_ylim(bottom=0)
    _legend(ax)
    return fig


# ---- the reviews' own pictures of replay bench results sets ---------------------------------

def sweep_mb(chart, title="Mix sweep: MB/s by read share"):
    """`chart`: an analysis.bench_charts.SweepChart of MB/s. The reviews' MB/s picture: one
    line per target and sweep, reads from 100 % at the left to 0 %, and beside it the bars
    the lines have, each in its line's colour: seed 000's 70/30 headline and seed 001's
    average of the six mixes."""
    panels = [(values, name) for values, name in ((chart.headline, "70/30\n(the headline)"),
                                                  (chart.average, "average of\nthe six mixes"))
              if values]
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(_SIZE[0] + 1.2 * len(panels), _SIZE[1]),
                             dpi=_DPI, layout="constrained", squeeze=False,
                             gridspec_kw={"width_ratios": (4, *[1] * len(panels))})
    ax = axes[0][0]
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _colours(ax, len(chart.lines))
    colour = {}
    for name, (x, y) in chart.lines.items():
        (line,) = ax.plot(np.array(x) * 100, y, marker="o", label=name)
        colour[name] = line.get_color()
    ax.set_xlim(102, -2)  # 100 % reads first, as the reviews draw it
    ax.set_xlabel("reads (% of I/Os)")
    ax.set_ylabel(chart.unit)
    ax.set_ylim(bottom=0)
    _legend(ax)
    for bar, (values, name) in zip(axes[0][1:], panels):
        names = list(values)
        bars = bar.bar(range(len(names)), [values[n] for n in names], color=[colour[n] for n in names])
        bar.bar_label(bars, [_short(values[n]) for n in names], fontsize="x-small", rotation=90,
                      padding=2)
        bar.set_title(name, fontsize="small")
        bar.set_xticks([])
        bar.set_ylim(0, max(values.values()) * 1.3 or 1)
        bar.set_ylabel(chart.unit)
        bar.grid(True, axis="y", alpha=0.3)
    return fig


def _short(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def point_bars(chart):
    """`chart`: an analysis.bench_charts.PointChart, one test of single points (seed 004's
    "4KB Random Write, QD=3"): a bar per target and data pattern, its value written beside it."""
    fig, ax = plt.subplots(figsize=(_SIZE[0], 1.2 + 0.35 * max(len(chart.bars), 2)), dpi=_DPI,
                           layout="constrained")
    names = list(chart.bars)
    bars = ax.barh(range(len(names)), [chart.bars[n] for n in names], color="tab:blue")
    ax.bar_label(bars, [_short(chart.bars[n]) for n in names], fontsize="x-small", padding=2)
    ax.set_yticks(range(len(names)), names, fontsize="x-small")
    ax.invert_yaxis()
    ax.set_title(chart.title)
    ax.set_xlabel(chart.unit)
    ax.set_xlim(0, max(chart.bars.values()) * 1.25 or 1)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def power_bars(chart):
    """`chart`: an analysis.bench_charts.PowerBars: the pages' two tabs side by side,
    efficiency (MB/s/W) and average power (W), a bar per target, each value written beside
    its bar; a missing efficiency (a zero-watt average) is an empty bar marked "-"."""
    names = list(chart.bars)
    fig, axes = plt.subplots(1, 2, figsize=(_SIZE[0] + 2, 1.4 + 0.4 * max(len(names), 2)),
                             dpi=_DPI, layout="constrained", sharey=True)
    fig.suptitle(chart.title)
    for ax, i, title, unit in ((axes[0], 1, "Power efficiency", "MB/s/W"),
                               (axes[1], 0, "Average power", "W")):
        values = [chart.bars[n][i] for n in names]
        shown = [0.0 if v is None else v for v in values]
        bars = ax.barh(range(len(names)), shown, color="tab:green" if i else "tab:orange")
        ax.bar_label(bars, ["-" if v is None else _short(v) for v in values], fontsize="x-small",
                     padding=2)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel(unit)
        ax.set_xlim(0, max(shown, default=0) * 1.25 or 1)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(names)), names, fontsize="x-small")
    axes[0].invert_yaxis()
    return fig


def latency_distribution(ranges: dict[str, list[tuple[str, float]]],
                         title="Latency distribution of the scored window"):
    """`ranges`: {label: [(latency range, share of I/Os)]} (analysis.bench_charts
    .latency_ranges); grouped bars in % of I/Os, the last range (over the slow limit, the
    consistency warning) hatched, each share written on its bar."""
    fig, ax = _figure(title)
    names = list(dict.fromkeys(r for rows in ranges.values() for r, _ in rows))
    width = 0.8 / max(len(ranges), 1)
    for i, (label, rows) in enumerate(ranges.items()):
        share = dict(rows)
        x = np.arange(len(names)) + (i - (len(ranges) - 1) / 2) * width
        heights = [share.get(n, 0.0) * 100 for n in names]
        bars = ax.bar(x, heights, width, label=label)
        bars[-1].set_hatch("//")
        # Each share written on its bar: the warning's few percent hardly show as a height.
        ax.bar_label(bars, [f"{h:.2g} %" if h else "" for h in heights], fontsize="xx-small",
                     padding=1)
    ax.set_xticks(range(len(names)), names, fontsize="x-small", rotation=30, ha="right")
    ax.set_xlabel("device latency (complete - issue) range; hatched: the consistency warning")
    ax.set_ylabel("I/Os (%)")
    ax.set_ylim(bottom=0)
    ax.grid(False, axis="x")
    _legend(ax)
    return fig


def qd_scaling(curves: dict[str, list[dict]], title="Queue-depth scaling"):
    """`curves`: {target label: rows with qd and iops (steady's qd_scaling)}; log2 QD axis."""
    fig, ax = _figure(title)
    for label, rows in curves.items():
        pts = sorted((int(r["qd"]), float(r["iops"])) for r in rows)
        x, y = zip(*pts)
        ax.plot(x, y, marker="o", label=label)
    ax.set_xscale("log", base=2)
    from matplotlib.ticker import ScalarFormatter

    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("queue depth (log scale)")
    ax.set_ylabel("IOPS")
    ax.set_ylim(bottom=0)
    _legend(ax)
    return fig


def scored_window(series: dict[str, tuple[np.ndarray, np.ndarray, float]],
                  title="Scored window: IOPS per second"):
    """`series`: {label: (t_s, per-second IOPS, window_s)}: the consistency scatter zoomed
    on the last `window_s` seconds the score is taken from, with each window's average."""
    fig, ax = _figure(title)
    _colours(ax, len(series))
    for label, (t, y, window_s) in series.items():
        t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
        keep = t >= len(t) - window_s
        dots = ax.scatter(t[keep], y[keep], s=6, label=label)
        if keep.any():
            ax.axhline(float(y[keep].mean()), color=dots.get_facecolor()[0], linewidth=1,
                       linestyle="--", label=f"{label} average")
    ax.set_xlabel("time since the run's start (s)")
    ax.set_ylabel("IOPS")
    ax.set_ylim(bottom=0)
    _legend(ax, markerscale=2)
    return fig
