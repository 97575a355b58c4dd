"""Comparing replays of the same trace (or bench test) on several targets: every metric side by
side with ratios to the first target, and which differences exceed run-to-run noise.

Noise comes from repeat runs when a target has several, else from a bootstrap over time
windows of each run. Only the CLI prints; bad input raises CompareError or ResultsError.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

from analysis.results import Results, ResultsError, ResultsSet, load
from analysis.summary import FIO_SECTIONS
from analysis.timeseries import N_BINS, bin_mid, bin_of
from traces.kernel_types import F64, I32, I64, U8, ro_c, rw
from traces.schema import RESULT_COLUMNS, Op

SECOND_NS = 1_000_000_000
# Bootstrap windows: 1 s, stretched or shrunk so that a run has between 20 and 600 of them
# (a 0.5 s replay still gets a spread; an hour-long one stays at ~30 MB of histograms).
MIN_WINDOWS, MAX_WINDOWS = 20, 600
RESAMPLES = 400
CONFIDENCE = 0.95
_COLUMNS = ("op", "length", *RESULT_COLUMNS)
_N_OPS = len(Op)
_ALL = _N_OPS  # index of "all ops" in the per-window arrays
_OP_NAMES = {int(op): op.name.lower() for op in Op}
LAT_KEYS = (("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9))


class CompareError(ResultsError):
    """The inputs cannot be compared as asked (different traces, mixed kinds, one target)."""


@numba.njit(
    (ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), I64, rw(I64, 2), rw(I64, 2), rw(F64, 2), rw(I32,
    3), rw(I32, 3), rw(I32, 2)),
    nogil=True, cache=True,
)
def _window_kernel(op, intended, issue, complete, result, bin_ns, count, nbytes, waiting,
                   dev_h, work_h, late_h):
    """Per completion window, per op and for all ops (index 4): I/Os, bytes, summed workload
    latency and device/workload latency histograms; lateness histogram for all ops."""
    for i in range(op.shape[0]):
        s = issue[i]
        if s < 0:
            continue
        c = complete[i]
        w = max(c, 0) // bin_ns
        k = np.int64(op[i])
        dev = c - s
        work = c - min(intended[i], s)
        late = max(s - intended[i], 0)
        bd, bw = bin_of(dev), bin_of(work)
        for g in (k, np.int64(4)):
            count[w, g] += 1
            if result[i] > 0:
                nbytes[w, g] += result[i]
            waiting[w, g] += work
            dev_h[w, g, bd] += 1
            work_h[w, g, bw] += 1
        late_h[w, bin_of(late)] += 1


@numba.njit((ro_c(F64, 2), F64), nogil=True, cache=True)
def _hist_percentile(hist, q):
    """Nearest-rank percentile of each row of a (resamples x bins) float histogram."""
    out = np.full(hist.shape[0], np.nan)
    for r in range(hist.shape[0]):
        n = 0.0
        for j in range(hist.shape[1]):
            n += hist[r, j]
        if n <= 0:
            continue
        rank = max(math.ceil(n * q / 100.0 - 1e-9), 1.0)
        seen = 0.0
        for j in range(hist.shape[1]):
            seen += hist[r, j]
            if seen >= rank:
                out[r] = bin_mid(j)
                break
    return out


@dataclass
class Windows:
    """Per-window figures of one run, the raw material of its bootstrap."""

    bin_ns: int
    count: np.ndarray  # (windows, ops + 1)
    nbytes: np.ndarray
    waiting: np.ndarray
    dev_h: np.ndarray  # (windows, ops + 1, N_BINS)
    work_h: np.ndarray
    late_h: np.ndarray  # (windows, N_BINS)


def window_ns(duration_ns) -> int:
    """1 s, unless that gives fewer than MIN_WINDOWS or more than MAX_WINDOWS windows."""
    d = max(int(duration_ns), 1)
    bin_ns = SECOND_NS
    if d // bin_ns < MIN_WINDOWS:
        bin_ns = max(d // MIN_WINDOWS, 1)
    elif d // bin_ns > MAX_WINDOWS:
        bin_ns = -(-d // MAX_WINDOWS)
    return int(bin_ns)


def windows(results: Results, bin_ns: int) -> Windows:
    """One streamed pass over a results file into per-window figures (memory per window)."""
    n = 0
    arrays = None

    def grow(size):
        nonlocal arrays, n
        shapes = ((_N_OPS + 1,), (_N_OPS + 1,), (_N_OPS + 1,), (_N_OPS + 1, N_BINS),
                  (_N_OPS + 1, N_BINS), (N_BINS,))
        dtypes = (np.int64, np.int64, np.float64, np.int32, np.int32, np.int32)
        new = [np.zeros((size, *shape), dtype) for shape, dtype in zip(shapes, dtypes)]
        if arrays is not None:
            for a, b in zip(new, arrays):
                a[:n] = b
        arrays, n = new, size

    grow(MAX_WINDOWS + 2)
    for chunk in results.chunks(list(_COLUMNS), rows=1 << 20):
        issue = np.ascontiguousarray(chunk["issue_ns"], dtype=np.int64)
        if not len(issue):
            continue
        complete = np.ascontiguousarray(chunk["complete_ns"], dtype=np.int64)
        needed = int(max(complete.max(), 0)) // bin_ns + 1
        if needed > n:
            grow(max(needed, 2 * n))
        _window_kernel(np.ascontiguousarray(chunk["op"], dtype=np.uint8),
                       np.ascontiguousarray(chunk["intended_ns"], dtype=np.int64), issue, complete,
                       np.ascontiguousarray(chunk["result"], dtype=np.int64), bin_ns, *arrays)
    busy = np.flatnonzero(arrays[0][:, _ALL])
    lo, hi = (int(busy[0]), int(busy[-1]) + 1) if busy.size else (0, 0)
    return Windows(bin_ns, *(a[lo:hi] for a in arrays))


# ---- metrics --------------------------------------------------------------------------------


@dataclass
class Metric:
    key: str  # "read iops", "all device p99", "waiting s"
    unit: str  # "IOPS", "MB/s", "ns", "s"
    better: str  # "higher" or "lower"


def _point_metrics(r: Results) -> dict:
    """Exact figures of one run from its summary (fio-shaped dict)."""
    summary = r.summary_dict
    job = summary["jobs"][0]
    tr = summary["tracereplay"]
    out = {}
    sections = [(name, job[FIO_SECTIONS[op]]) for op, name in
                ((op, _OP_NAMES[int(op)]) for op in Op) if job[FIO_SECTIONS[op]]["total_ios"]]
    sections.append(("all", tr["all"]))
    for name, sec in sections:
        out[f"{name} iops"] = sec["iops"]
        if name != "flush":
            out[f"{name} MB/s"] = sec["io_bytes"] * 1e3 / tr["duration_ns"] if tr["duration_ns"] else 0.0
        for kind, block in (("device", "clat_ns"), ("workload", "lat_ns")):
            pct = sec[block].get("percentile", {})
            for label, q in LAT_KEYS:
                out[f"{name} {kind} {label}"] = pct.get(f"{q:.6f}")
            out[f"{name} {kind} max"] = sec[block]["max"]
    late = tr["all"]["lateness_ns"]
    for label, q in (("p50", 50.0), ("p99", 99.0)):
        out[f"lateness {label}"] = late.get("percentile", {}).get(f"{q:.6f}")
    out["lateness max"] = late["max"]
    lat = tr["all"]["lat_ns"]
    out["waiting s"] = lat["mean"] * lat["N"] / 1e9
    if r.runs_to_finish:
        out["duration s"] = tr["duration_ns"] / 1e9
    return out


def describe(key) -> Metric:
    if key.startswith("score "):
        return Metric(key, "score", "higher")
    if key.endswith("iops"):
        return Metric(key, "IOPS", "higher")
    if key.endswith("MB/s"):
        return Metric(key, "MB/s", "higher")
    if key.endswith(" s"):
        return Metric(key, "s", "lower")
    return Metric(key, "ns", "lower")


def _bootstrap(r: Results, point: dict, seed=0) -> dict:
    """95 % basic-bootstrap intervals per metric from resampled windows (None where a window
    bootstrap says nothing: maxima). The windows are resampled independently, which ignores
    their correlation: treat the intervals as a lower bound on the noise."""
    w = windows(r, window_ns(r.summary_dict["tracereplay"]["duration_ns"]))
    n = len(w.count)
    if n < 2:
        return {}
    rng = np.random.default_rng(seed)
    weights = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(RESAMPLES)]
                       ).astype(np.float64)
    span_s = n * w.bin_ns / SECOND_NS
    alpha = (1 - CONFIDENCE) / 2
    out = {}

    def interval(key, boot, full):
        value = point.get(key)
        boot = boot[np.isfinite(boot)]
        if value is None or not boot.size or not np.isfinite(full):
            return
        lo, hi = np.quantile(boot, [alpha, 1 - alpha])
        # Basic bootstrap around the exact figure: the windowed estimate's spread, shifted.
        out[key] = (float(value - (full - lo) if full >= lo else value),
                    float(value + (hi - full) if hi >= full else value))
        out[key] = (min(out[key]), max(out[key]))

    groups = [(name, g) for g, name in _OP_NAMES.items()] + [("all", _ALL)]
    for name, g in groups:
        if f"{name} iops" not in point:
            continue
        for key, col in ((f"{name} iops", w.count[:, g]), (f"{name} MB/s", w.nbytes[:, g] / 1e6)):
            interval(key, weights @ col / span_s, float(col.sum()) / span_s)
        for kind, hist in (("device", w.dev_h[:, g, :]), ("workload", w.work_h[:, g, :])):
            h = hist.astype(np.float64)
            boot_h, full_h = weights @ h, h.sum(axis=0, keepdims=True)
            for label, q in LAT_KEYS:
                interval(f"{name} {kind} {label}", _hist_percentile(boot_h, q),
                         float(_hist_percentile(full_h, q)[0]))
    late = w.late_h.astype(np.float64)
    boot_late, full_late = weights @ late, late.sum(axis=0, keepdims=True)
    for label, q in (("p50", 50.0), ("p99", 99.0)):
        interval(f"lateness {label}", _hist_percentile(boot_late, q),
                 float(_hist_percentile(full_late, q)[0]))
    waiting = w.waiting[:, _ALL] / 1e9
    # A fixed workload's total: resampled windows are scaled to the run's whole I/O count.
    count = w.count[:, _ALL].astype(np.float64)
    per_io = (weights @ waiting) / np.maximum(weights @ count, 1)
    interval("waiting s", per_io * count.sum(), float(waiting.sum()))
    if "duration s" in point:
        iops = (weights @ count) / span_s
        interval("duration s", count.sum() / np.maximum(iops, 1e-12), span_s)
    return out


# ---- the comparison -------------------------------------------------------------------------


@dataclass
class Target:
    label: str
    runs: list  # Results (or ResultsSet) objects
    values: dict = field(default_factory=dict)  # metric -> value
    intervals: dict = field(default_factory=dict)  # metric -> (lo, hi)
    noise: str = "bootstrap"

    @property
    def interrupted(self) -> bool:
        return any(r.interrupted for r in self.runs)


@dataclass
class Comparison:
    name: str  # the trace's name, or the bench test's
    kind: str  # "results" or "set"
    targets: list
    metrics: list  # Metric, in display order
    notes: list = field(default_factory=list)

    def ratio(self, key, i):
        base, v = self.targets[0].values.get(key), self.targets[i].values.get(key)
        if base is None or v is None or base == 0:
            return None
        return v / base

    def significant(self, key, i):
        """True when target i's and the first target's intervals do not overlap; None when
        either has no interval for this metric."""
        a, b = self.targets[0].intervals.get(key), self.targets[i].intervals.get(key)
        if i == 0 or a is None or b is None:
            return None
        return bool(a[1] < b[0] or b[1] < a[0])

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "confidence": CONFIDENCE,
            "targets": [{"label": t.label, "files": [str(r.path) for r in t.runs],
                         "interrupted": t.interrupted, "partial": t.interrupted,
                         "noise": t.noise} for t in self.targets],
            "metrics": [
                {"metric": m.key, "unit": m.unit, "better": m.better,
                 "values": [t.values.get(m.key) for t in self.targets],
                 "intervals": [list(t.intervals[m.key]) if m.key in t.intervals else None
                               for t in self.targets],
                 "ratios": [self.ratio(m.key, i) for i in range(len(self.targets))],
                 "significant": [self.significant(m.key, i) for i in range(len(self.targets))]}
                for m in self.metrics
            ],
            "notes": self.notes,
        }

    def format_table(self) -> str:
        """One line per metric: each target's value, then ratio to the first; '*' marks a
        difference larger than the noise."""
        heads = [t.label + (" (partial)" if t.interrupted else "") for t in self.targets]
        width = max(20, *(len(h) + 2 for h in heads))
        lines = [f"{self.kind} {self.name!r}: {len(self.targets)} targets; ratios to "
                 f"{heads[0]}; * = beyond run-to-run noise ({CONFIDENCE:.0%} intervals)"]
        lines.append(f"{'metric':<26}" + "".join(f"{h:>{width}}" for h in heads))
        for m in self.metrics:
            cells = []
            for i, t in enumerate(self.targets):
                v = t.values.get(m.key)
                text = _fmt(v, m.unit)
                if i:
                    r = self.ratio(m.key, i)
                    mark = "*" if self.significant(m.key, i) else " "
                    text += f" x{r:.2f}{mark}" if r is not None else "      "
                cells.append(f"{text:>{width}}")
            lines.append(f"{m.key:<26}" + "".join(cells))
        for t in self.targets:
            lines.append(f"{t.label}: noise from {t.noise}; " + ", ".join(str(r.path) for r in t.runs))
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _fmt(v, unit):
    if v is None:
        return "-"
    if unit == "ns":
        v = float(v)
        for div, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if v >= div:
                return f"{v / div:.3g}{suffix}"
        return f"{v:.0f}ns"
    if unit == "s":
        return f"{v:.3g}s"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def target_label(target: dict, fallback: str = "target") -> str:
    """The name of a run's target: its path, or "scratch" for the temporary file `replay run`
    makes without a TARGET (replay.targets.scratch_target: TMPDIR/tracereplay-XXXX/scratch.img),
    whose path is gone after the run and differs every time."""
    path = str(target.get("path") or "")
    if target.get("scratch") or (target.get("kind") == "file" and Path(path).name == "scratch.img"
                                 and Path(path).parent.name.startswith("tracereplay-")):
        return "scratch"
    return path or fallback


def _group(inputs, labels):
    if labels:
        if len(labels) != len(inputs):
            raise CompareError(f"{len(labels)} labels for {len(inputs)} inputs; give one --label per input, "
                               "the same label for repeat runs of one target")
        keys = list(labels)
    else:
        keys = [target_label(r.target, str(r.path)) for r in inputs]
        if len(set(keys)) == 1 and len(inputs) > 1:
            keys = [r.path.stem if isinstance(r, Results) else r.path.name for r in inputs]
    groups = {}
    for key, r in zip(keys, inputs):
        groups.setdefault(key, []).append(r)
    return groups


def _set_points(s: ResultsSet, with_noise: bool):
    """Metrics of a results set: each measured run's, prefixed with its name, and the
    numeric headline scores."""
    values, intervals = {}, {}
    for run in s.measured() or s.runs:
        point = _point_metrics(run)
        values.update({f"{run.run_name}: {k}": v for k, v in point.items()})
        if with_noise:
            intervals.update({f"{run.run_name}: {k}": v for k, v in _bootstrap(run, point).items()})
    for key, v in s.scores.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values[f"score {key}"] = float(v)
    return values, intervals


def compare(paths, labels=None, force=False) -> Comparison:
    """Compare results files (or results sets) of one trace (or bench test) on several targets.

    Inputs with the same label (or, without labels, the same target path) are repeat runs of one
    target: its value is their mean and its interval their range. A target with one run gets a
    bootstrap interval over time windows. Different traces are refused unless `force`.
    """
    if len(paths) < 2:
        raise CompareError("give at least two results to compare (files of `replay run` or "
                           "directories of `replay bench`)")
    inputs = [load(p) for p in paths]
    kinds = {isinstance(r, ResultsSet) for r in inputs}
    if len(kinds) > 1:
        raise CompareError("cannot compare results files with results sets; give only files of "
                           "`replay run` or only directories of `replay bench`")
    is_set = kinds.pop()
    names = [r.name for r in inputs]
    notes = []
    if len(set(names)) > 1:
        first = names[0]
        other = next(n for n in names if n != first)
        what = "bench tests" if is_set else "traces"
        if not force:
            raise CompareError(
                f"{inputs[0].path} is {what[:-1]} {first!r} but "
                f"{inputs[names.index(other)].path} is {other!r}: results of different {what} "
                "are not comparable; give --force to compare them anyway")
        notes.append(f"different {what} compared (--force): {', '.join(sorted(set(names)))}")
    groups = _group(inputs, labels)
    if len(groups) < 2:
        raise CompareError("every input is a repeat run of one target; compare at least two "
                           "targets (give --label to say which runs belong to which)")
    targets = []
    for label, runs in groups.items():
        t = Target(label, runs)
        repeats = len(runs) > 1
        points = []
        for r in runs:
            if is_set:
                values, intervals = _set_points(r, with_noise=not repeats)
            else:
                values = _point_metrics(r)
                intervals = {} if repeats else _bootstrap(r, values)
            points.append(values)
        keys = [k for k in points[0] if all(k in p for p in points)]
        for k in keys:
            vals = [p[k] for p in points if p[k] is not None]
            t.values[k] = sum(vals) / len(vals) if vals else None
            if repeats and len(vals) == len(points):
                t.intervals[k] = (min(vals), max(vals))
        if repeats:
            t.noise = f"{len(runs)} repeat runs (range)"
        else:
            t.intervals = intervals
            t.noise = "bootstrap over time windows"
        if t.interrupted:
            notes.append(f"{label}: interrupted run(s), figures are partial")
        targets.append(t)
    keys = [k for k in targets[0].values if any(k in t.values for t in targets[1:])]
    missing = sorted({k for t in targets for k in t.values} - set(keys))
    if missing:
        notes.append(f"{len(missing)} metrics only some targets have are left out "
                     f"(for example {missing[0]!r})")
    name = names[0] if len(set(names)) == 1 else " / ".join(dict.fromkeys(names))
    return Comparison(name, "bench test" if is_set else "trace", targets,
                      [describe(k) for k in keys], notes)
