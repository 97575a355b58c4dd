"""The real-use suite's scores, as reviews print them: each workload's predicted run time and
its ratio to the capture's, data rate over busy time (idle gaps capped, as AnandTech's
Storage Bench), average and p99 access times, and a PCMark-style composite (ours).

Pure functions over a results file's columns; docs/suite.md defines every figure.
"""
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from analysis.compare import target_label
from traces.schema import Op

# The Storage Bench caps each idle gap at 25 ms, so a workload's pauses (its users' think
# time) do not dilute its data rate, while a short one still counts as the drive's own time.
IDLE_CAP_NS = 25_000_000
# The percentile reported beside the average, nearest rank.
TAIL = 99.0
# Columns score_workload reads from a results file (latency_ns when the trace has it).
COLUMNS = ("op", "ts_ns", "intended_ns", "issue_ns", "complete_ns", "result")
_DATA_OPS = (Op.READ, Op.WRITE)


def busy_ns(issue_ns, complete_ns, idle_cap_ns: int = IDLE_CAP_NS) -> int:
    """The time from the first issue to the last completion, with each idle gap (no I/O in
    flight) counted as at most `idle_cap_ns`."""
    issue = np.asarray(issue_ns, dtype=np.int64)
    if not len(issue):
        return 0
    order = np.argsort(issue, kind="stable")
    start = issue[order]
    end = np.maximum.accumulate(np.asarray(complete_ns, dtype=np.int64)[order])
    gaps = start[1:] - end[:-1]  # > 0: nothing was in flight from end[i] to start[i + 1]
    excess = np.maximum(gaps - idle_cap_ns, 0)
    return int(end[-1] - start[0] - excess.sum())


def nearest_rank(values, q: float = TAIL) -> int | None:
    """The q-th percentile by nearest rank: the smallest value with at least q % of the
    values at or below it. None for no values."""
    values = np.sort(np.asarray(values, dtype=np.int64))
    if not len(values):
        return None
    rank = max(math.ceil(len(values) * q / 100 - 1e-9), 1)
    return int(values[rank - 1])


@dataclass
class Access:
    """Device access time (complete - issue) of one op's successful I/Os."""

    ios: int
    mean_ns: float | None
    p99_ns: int | None

    @classmethod
    def of(cls, latency_ns) -> "Access":
        latency = np.asarray(latency_ns, dtype=np.int64)
        return cls(len(latency), float(latency.mean()) if len(latency) else None, nearest_rank(latency))


@dataclass
class WorkloadScore:
    """One workload's figures on one drive (or the suite's overall row)."""

    name: str
    ios: int  # I/Os issued
    bytes: int  # bytes read and written (successful reads and writes)
    run_time_ns: int  # first intended to last completion: the application's run time (causal)
    capture_ns: int  # the same span in the capture: first ts_ns to last ts_ns + latency_ns
    busy_ns: int
    read: Access
    write: Access
    access: Access  # reads and writes together
    partial: bool = False

    @property
    def run_time_ratio(self) -> float | None:
        """The run time here over the capture's: below 1, the workload finishes sooner here."""
        return self.run_time_ns / self.capture_ns if self.capture_ns > 0 else None

    @property
    def data_rate(self) -> float:
        """Bytes per second of busy time."""
        return self.bytes * 1e9 / self.busy_ns if self.busy_ns > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "run_time_ratio": self.run_time_ratio, "data_rate": self.data_rate}


def _issued(columns: dict) -> dict:
    issued = np.asarray(columns["issue_ns"]) >= 0
    return {k: np.asarray(v)[issued] for k, v in columns.items()}


def device_latencies(columns: dict) -> dict:
    """{"read": ..., "write": ...}: complete - issue of the successful reads and writes."""
    col = _issued(columns)
    device = col["complete_ns"].astype(np.int64) - col["issue_ns"].astype(np.int64)
    ok = col["result"] >= 0
    return {kind.name.lower(): device[ok & (col["op"] == kind)] for kind in _DATA_OPS}


def score_workload(name: str, columns: dict, partial: bool = False) -> WorkloadScore:
    """The figures of one replay from its results columns (COLUMNS, and latency_ns when the
    trace carries it), over the I/Os that were issued."""
    col = _issued(columns)
    op, result = col["op"], col["result"]
    if not len(op):
        raise ValueError(f"{name}: no I/O was issued")
    issue, complete = col["issue_ns"].astype(np.int64), col["complete_ns"].astype(np.int64)
    ts = col["ts_ns"].astype(np.int64)
    captured_end = ts + col["latency_ns"] if "latency_ns" in col else ts
    data = np.isin(op, _DATA_OPS) & (result >= 0)
    latencies = device_latencies(col)
    return WorkloadScore(
        name=name, ios=len(op), bytes=int(result[data].sum()),
        run_time_ns=int(complete.max() - np.minimum(col["intended_ns"], issue).min()),
        capture_ns=int(captured_end.max() - ts.min()), busy_ns=busy_ns(issue, complete),
        read=Access.of(latencies["read"]), write=Access.of(latencies["write"]),
        access=Access.of((complete - issue)[data]), partial=partial)


def overall(workloads: list[WorkloadScore], latencies: dict) -> WorkloadScore:
    """The suite's row: run times, bytes and busy times summed over the workloads, access
    times over every I/O of all of them (`latencies`: "read" and "write" device latency
    arrays, pooled)."""
    read, write = (np.asarray(latencies[k], dtype=np.int64) for k in ("read", "write"))
    return WorkloadScore(
        name="overall", ios=sum(w.ios for w in workloads), bytes=sum(w.bytes for w in workloads),
        run_time_ns=sum(w.run_time_ns for w in workloads), capture_ns=sum(w.capture_ns for w in workloads),
        busy_ns=sum(w.busy_ns for w in workloads), read=Access.of(read), write=Access.of(write),
        access=Access.of(np.concatenate([read, write])), partial=any(w.partial for w in workloads))


def composite(workloads: list[WorkloadScore]) -> float | None:
    """Ours, after PCMark 10's storage score: the geometric mean, over all workloads, of the
    data rate in MB/s and of 1 / the average access time in ms (2 numbers a workload). None
    when a workload moved no data."""
    terms = []
    for w in workloads:
        if w.data_rate <= 0 or not w.access.mean_ns:
            return None
        terms += [w.data_rate / 1e6, 1e6 / w.access.mean_ns]
    return math.exp(sum(map(math.log, terms)) / len(terms)) if terms else None


@dataclass
class SuiteScores:
    """Every workload's figures on one drive, the overall row and the composite."""

    target: str
    timing: str
    workloads: list[WorkloadScore]
    overall: WorkloadScore
    composite: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"target": self.target, "timing": self.timing, "composite": self.composite,
                "workloads": [w.to_dict() for w in self.workloads], "overall": self.overall.to_dict(),
                "notes": self.notes}

    def format_table(self) -> str:
        head = (f"{'workload':<14}{'run time':>10}{'vs capture':>11}{'MB/s':>9}{'read avg':>10}"
                f"{'read p99':>10}{'write avg':>10}{'write p99':>10}")
        lines = [f"{self.target}, {self.timing} timing", head]
        for w in [*self.workloads, self.overall]:
            ratio = w.run_time_ratio
            lines.append(
                f"{w.name + (' *' if w.partial else ''):<14}{_secs(w.run_time_ns):>10}"
                f"{'-' if ratio is None else f'{ratio:.2f}x':>11}{w.data_rate / 1e6:>9.1f}"
                f"{_secs(w.read.mean_ns):>10}{_secs(w.read.p99_ns):>10}"
                f"{_secs(w.write.mean_ns):>10}{_secs(w.write.p99_ns):>10}")
        c = self.composite
        score = "-" if c is None else f"{c:,.0f}" if c >= 100 else f"{c:.3g}"
        lines += ["", f"composite (ours, PCMark-style: geometric mean of MB/s and 1 / average access "
                      f"time in ms over the workloads): {score}"]
        if any(w.partial for w in self.workloads):
            lines.append("* partial: an interrupted run, scored over the I/Os it did")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _secs(ns) -> str:
    if ns is None:
        return "-"
    for div, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if ns >= div:
            return f"{ns / div:.3g}{unit}"
    return f"{ns:.0f}ns"


def score_suite(target: str, timing: str, named_columns, notes=()) -> SuiteScores:
    """SuiteScores from (name, columns, partial) per workload, columns as score_workload's."""
    workloads, pooled = [], {"read": [], "write": []}
    for name, columns, partial in named_columns:
        workloads.append(score_workload(name, columns, partial))
        for key, latency in device_latencies(columns).items():
            pooled[key].append(latency)
    if not workloads:
        raise ValueError("no workload to score")
    latencies = {k: np.concatenate(v) for k, v in pooled.items()}
    return SuiteScores(target, timing, workloads, overall(workloads, latencies), composite(workloads),
                       list(notes))


def columns_of(results) -> dict:
    """A results file's (analysis.results.Results) COLUMNS, and latency_ns when it has it,
    as whole arrays: the scores sort and rank every I/O of a workload."""
    names = [*COLUMNS, *(["latency_ns"] if results.has("latency_ns") else [])]
    parts = list(results.chunks(names))
    return {n: np.concatenate([p[n] for p in parts]) for n in names}


def score_results(target: str, timing: str, runs, notes=()) -> SuiteScores:
    """SuiteScores of results files (Results), one per workload, named by their run name."""
    return score_suite(target, timing, ((r.run_name, columns_of(r), r.interrupted) for r in runs), notes)


def score_set(suite) -> SuiteScores:
    """The scores of a `replay suite` results set (analysis.results.ResultsSet), from its files."""
    timing = str((suite.options or {}).get("timing") or "causal")
    return score_results(target_label(suite.target), timing, suite.measured())
