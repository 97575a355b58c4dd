"""What the reviews' charts of `replay bench` results sets show, as plain numbers: the sweeps
as lines, the 70/30 headline and the average of the six mixes as bars beside them, single
points (seed 004's Iometer tests) as one bar chart per test, steady's latency distribution,
and with a power log the average power and efficiency of the sweeps, the 70/30 test and ACT.
analysis.plots draws them; the tests check these numbers, not pixels.
"""
from dataclasses import dataclass, field

from analysis.score_labels import RUN_VALUES, share_words, split_words

SIX_SHARES = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)  # seed 001's six mixes, whose MB/s it averages
HEADLINE_SHARE = 0.7  # seed 000's (and the verdict's) 70/30


def _split(row) -> str:
    return row.get("split") or f"{row.get('workers', 1)}x{row['qd']}"


def sweeps(rows: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(split, data pattern, rows) of each sweep of a results set's table: the table's runs of
    consecutive rows at one split and data pattern, as `mix` runs one sweep after another
    (seed 004's QD3 writes and its QD3 reads are two sweeps of one point each)."""
    out = []
    for row in rows:
        key = (_split(row), row.get("data", "random"))
        if out and out[-1][:2] == key:
            out[-1][2].append(row)
        else:
            out.append((*key, [row]))
    return out


def _sweep_name(label: str, split: str, data: str) -> str:
    return f"{label} {split_words(split)}" + ("" if data == "random" else f", {data} data")


def _unique(name: str, taken) -> str:
    n, out = 1, name
    while out in taken:
        n += 1
        out = f"{name} #{n}"
    return out


@dataclass
class SweepChart:
    """`lines`: {name: (read shares ascending, values)}, each sweep of two points or more;
    `headline`: {name: value at 70/30} and `average`: {name: average over SIX_SHARES} of the
    lines that have them (the bars beside the sweep); `unit`: the values' ("MB/s", "IOPS",
    "W", "MB/s/W")."""

    unit: str
    lines: dict = field(default_factory=dict)
    headline: dict = field(default_factory=dict)
    average: dict = field(default_factory=dict)


def sweep_chart(tables: dict[str, list[dict]], value: str = "mb_per_s") -> SweepChart:
    """The sweep lines of {target tag: table rows}, with their 70/30 and six-mix bars; a
    sweep of one point is a test of its own (point_charts), not a line. `value`: a key of
    score_labels.RUN_VALUES; a point without it (None: a run the power log does not cover)
    is left out of its line, a line without any is not drawn. Seed 001's six-mix average is
    of MB/s and IOPS only: no page averages power over the mixes."""
    chart = SweepChart(RUN_VALUES[value][1])
    for label, rows in tables.items():
        for split, data, points in sweeps(rows):
            if len({float(r["read_share"]) for r in points}) < 2:
                continue
            pts = sorted((float(r["read_share"]), float(r[value])) for r in points
                         if r.get(value) is not None)
            if not pts:
                continue
            name = _unique(_sweep_name(label, split, data), chart.lines)
            chart.lines[name] = ([x for x, _ in pts], [y for _, y in pts])
            by_share = dict(pts)
            if HEADLINE_SHARE in by_share:
                chart.headline[name] = by_share[HEADLINE_SHARE]
            if value in ("mb_per_s", "iops") and all(s in by_share for s in SIX_SHARES):
                chart.average[name] = sum(by_share[s] for s in SIX_SHARES) / len(SIX_SHARES)
    return chart


POWER_VALUES = ("average_w", "mb_per_s_per_w", "iops_per_w")


def with_power(rows: list[dict], runs: list[dict], prefix: str = "") -> list[dict]:
    """A results set's table `rows` with each point's run's power (POWER_VALUES, None where
    the log did not cover the run) from results.json's `runs`; `prefix`: the pass's run
    names' ("op25-" for a set whose first pass is over-provisioned)."""
    watts = {r.get("name"): r.get("power") or {} for r in runs}
    return [{**row, **{k: watts.get(prefix + str(row.get("run")), {}).get(k) for k in POWER_VALUES}}
            for row in rows]


def has_power(runs: list[dict]) -> bool:
    """Whether any run of a set was measured by a power log."""
    return any(r.get("power") for r in runs)


@dataclass
class PowerBars:
    """One test's power as the pages draw it beside its score: `bars` {name: (average W,
    MB/s/W)} per target, `title` the test's."""

    title: str
    bars: dict = field(default_factory=dict)


def steady_power_bars(sets: dict[str, dict]) -> PowerBars:
    """Seed 002's "70R/30W (QD32) Efficiency" of {tag: a steady pass's scores}: the power
    over the scored window (replay.bench.scores.power_scores), the efficiency at its steady
    IOPS; a pass without them has no bar."""
    chart = PowerBars("Steady-state scored window: efficiency and average power")
    for tag, s in sets.items():
        if s.get("steady_average_w") is not None:
            share = s.get("read_share")
            name = tag if share is None else f"{tag}, {share_words(round(share * 100))}"
            chart.bars[_unique(name, chart.bars)] = (s["steady_average_w"], s["steady_mb_per_s_per_w"])
    return chart


def act_power_bars(sets: dict[str, dict]) -> PowerBars:
    """Seed 000's "Aerospike ACT: Power Efficiency" of {tag: ACT scores}: each target's run at
    its passing multiple; a target that passed none, or ran without a power log, has no bar."""
    chart = PowerBars("Aerospike ACT at the passing multiple: efficiency and average power")
    for tag, s in sets.items():
        if s.get("act_average_w") is not None:
            chart.bars[_unique(f"{tag} at {s['act_multiple']:g}x", chart.bars)] = (
                s["act_average_w"], s["act_mb_per_s_per_w"])
    return chart


@dataclass
class PointChart:
    """One test of single points (seed 004's "4KB Random Write, QD=3"): `bars` {target tag
    and data pattern: value}, in the order run."""

    split: str
    read_share: float
    title: str
    unit: str
    bars: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"point_{self.split}_r{round(self.read_share * 100)}"


def point_charts(tables: dict[str, list[dict]], what: str = "4 KiB random",
                 value: str = "mb_per_s") -> list[PointChart]:
    """One bar chart per test among the single-point sweeps of {target tag: table rows}: a
    test is a split and a read share, its bars each target's data patterns (seed 004 shows
    fully random and pseudo-random data side by side)."""
    charts: dict[tuple, PointChart] = {}
    unit = RUN_VALUES[value][1]
    for label, rows in tables.items():
        for split, data, points in sweeps(rows):
            if len({float(r["read_share"]) for r in points}) != 1:
                continue
            for row in points:
                share = float(row["read_share"])
                chart = charts.setdefault((split, share), PointChart(
                    split, share, f"{what} {share_words(round(share * 100))}, {split_words(split)}", unit))
                bar = _unique(f"{label}, {data} data", chart.bars)
                chart.bars[bar] = float(row[value])
    return list(charts.values())


def _time(ns: float) -> str:
    return f"{ns / 1e6:g} ms" if ns >= 1e6 else f"{ns / 1e3:g} us"


def _range(low: float, high: float) -> str:
    if (low >= 1e6) == (high >= 1e6):
        div, unit = (1e6, "ms") if low >= 1e6 else (1e3, "us")
        return f"{low / div:g}-{high / div:g} {unit}"
    return f"{_time(low)}-{_time(high)}"


def latency_ranges(distribution: dict) -> list[tuple[str, float]]:
    """(range, share of the I/Os) per range of a steady set's "latency_distribution" score
    (scoring.latency_distribution): "<= 50 us", "50-100 us", ..., "> 10 ms"."""
    edges, counts = distribution["edges_ns"], distribution["counts"]
    total = sum(counts)
    names = ([f"<= {_time(edges[0])}"] + [_range(a, b) for a, b in zip(edges, edges[1:])]
             + [f"> {_time(edges[-1])}"]) if edges else ["all"]
    return [(name, c / total if total else 0.0) for name, c in zip(names, counts)]
