"""Every number a `replay bench` results set scores, in words: one table of labels and units
that the console, the report and the charts all read, so a key never prints raw.
"""
import math
import re

# Fixed keys: key -> (label, unit). Units: "%" is a share 0..1 shown as a percent, "ns" a
# time shown in ms or us, "x load" ACT's multiple, "" a plain ratio.
LABELS = {
    "steady_iops": ("steady state, average of the scored window", "IOPS"),
    "stddev_iops": ("standard deviation of per-second IOPS in the scored window", "IOPS"),
    # Seed 003 states this score; seed 002 charts consistency without a formula, so there it
    # is an assumption (its preset says so).
    "consistency": ("consistency (average / standard deviation of per-second IOPS in the "
                    "scored window, seed 003's score)", ""),
    "window_s": ("scored window", "s"),
    "round_s": ("steady-state round", "s"),
    "slow_share": ("I/Os over the slow limit in the scored window", "%"),
    "slow_share_run": ("I/Os over the slow limit over the whole run", "%"),
    "slow_ns": ("slow limit (the consistency warning)", "ns"),
    "read_share": ("reads", "%"),
    "act_multiple": ("ACT", "x load"),
    "search_start": ("ACT search started at", "x load"),
    "act_threads": ("ACT's threads (the most transactions in flight)", "threads"),
    # --power-log: the power of what the charts headline (replay.bench.scores.power_scores).
    "steady_average_w": ("average power over the scored window", "W"),
    "steady_mb_per_s_per_w": ("efficiency over the scored window", "MB/s/W"),
    "steady_iops_per_w": ("efficiency over the scored window", "IOPS/W"),
    "steady_power_covered": ("part of the scored window the power log covers", "%"),
    "act_average_w": ("ACT's average power at its passing multiple", "W"),
    "act_mb_per_s_per_w": ("ACT's efficiency at its passing multiple", "MB/s/W"),
    "act_iops_per_w": ("ACT's efficiency at its passing multiple", "IOPS/W"),
}

# What a run measures (a mix table's row, a run's power): key -> (label, unit), the charts'
# axes and the console's columns.
RUN_VALUES = {
    "mb_per_s": ("throughput", "MB/s"),
    "iops": ("throughput", "IOPS"),
    "average_w": ("average power", "W"),
    "mb_per_s_per_w": ("efficiency", "MB/s/W"),
    "iops_per_w": ("efficiency", "IOPS/W"),
}

# The mix and seqmix sweeps' keys name a point or a sweep: its split (WORKERSxQD) and, other
# than random, its data pattern ("compressible50" for compressible:50).
_POINT = r"(?P<split>\d+x\d+)(?:_(?P<data>[a-z0-9]+))?"
PATTERNS = (
    (re.compile(rf"iops_70_30_{_POINT}"), "70/30", "IOPS"),
    (re.compile(rf"mb_per_s_70_30_{_POINT}"), "70/30", "MB/s"),
    (re.compile(rf"mb_per_s_r(?P<pct>\d+)_{_POINT}"), None, "MB/s"),  # a single point (seed 004)
    (re.compile(rf"mb_per_s_average_{_POINT}"), "average of the six mixes,", "MB/s"),
    (re.compile(rf"average_w_70_30_{_POINT}"), "average power at 70/30", "W"),
    (re.compile(rf"mb_per_s_per_w_70_30_{_POINT}"), "efficiency at 70/30", "MB/s/W"),
    (re.compile(rf"iops_per_w_70_30_{_POINT}"), "efficiency at 70/30", "IOPS/W"),
)


def split_words(split: str) -> str:
    """A split "1x32" (workers x QD) in words: "QD32", "32 workers x QD1"."""
    workers, _, qd = split.partition("x")
    if not (workers.isdigit() and qd.isdigit()):
        return split
    return f"QD{qd}" if workers == "1" else f"{workers} workers x QD{qd}"


def data_words(key_data: str | None) -> str:
    """A key's data suffix as `--data` spells it: "compressible50" -> "compressible:50"."""
    if not key_data:
        return "random"
    m = re.fullmatch(r"compressible(\d+)", key_data)
    return f"compressible:{m.group(1)}" if m else key_data


def share_words(percent: int) -> str:
    """A read share in percent as the reviews title a test: writes, reads, or the mix."""
    return {0: "writes", 100: "reads"}.get(int(percent), f"{int(percent)} % reads")


def label(key: str) -> tuple[str, str] | None:
    """(label, unit) of a score key, or None for a key the table does not know."""
    if key in LABELS:
        return LABELS[key]
    for pattern, what, unit in PATTERNS:
        m = pattern.fullmatch(key)
        if m:
            what = what or share_words(int(m.group("pct")))
            data = f", {data_words(m.group('data'))} data" if m.group("data") else ""
            return f"{what} {split_words(m.group('split'))}{data}", unit
    return None


def number(v: float) -> str:
    """33,220 or 0.25: grouped digits, never scientific notation."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.2g}"


def value_words(value: float, unit: str) -> str:
    """A value in its unit: "60,868 MB/s", "3.1 %", "10 ms", "40x load"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if unit == "%":
        return f"{value * 100:.3g} %"
    if unit == "x load":
        return f"{value:g}x load"
    if unit == "ns":
        return f"{value / 1e6:g} ms" if value >= 1e6 else f"{value / 1e3:g} us"
    return f"{number(value)}{' ' + unit if unit else ''}"


def words(key: str, value: float) -> str | None:
    """"label: value unit" for a score the table knows, else None."""
    known = label(key)
    return None if known is None else f"{known[0]}: {value_words(value, known[1])}"


def numeric(scores: dict) -> dict:
    """The scores that are numbers (not flags, tables or series)."""
    return {k: v for k, v in scores.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
