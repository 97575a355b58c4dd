"""The run summary: per-op counts, bytes, errors and latency histograms, accumulated chunk by chunk.

Memory is bounded by a chunk, whatever the run length. `to_dict` follows fio's JSON key names;
`format_table` is the console view. Only the CLI prints.
"""
import errno

import numba
import numpy as np

from analysis.histogram import FIO_PERCENTILES, N_BINS, LatencyHistogram, bin_index
from traces.kernel_types import F64, I64, U8, ro_c, rw
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

# The columns a result chunk must have. Spelled here only as lookups into the schema, checked
# at import so that a rename in traces/schema.py fails here rather than at the first chunk.
_COLUMNS = ("op", "length", "intended_ns", "issue_ns", "complete_ns", "result")
assert all(name in TRACE_COLUMNS or name in RESULT_COLUMNS for name in _COLUMNS)
_N_OPS = len(Op)
assert sorted(int(op) for op in Op) == list(range(_N_OPS))

# fio's JSON section for each op; fio calls discards "trim" and flushes "sync".
FIO_SECTIONS = {Op.READ: "read", Op.WRITE: "write", Op.DISCARD: "trim", Op.FLUSH: "sync"}
# Ops whose result should equal their length; a smaller non-negative result is a short transfer.
_TRANSFER_OPS = (Op.READ, Op.WRITE)


def errno_name(code):
    """'EIO' for 5; the number as a string when the platform has no name for it."""
    return errno.errorcode.get(code, str(code))


@numba.njit((ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), rw(I64, 2)), nogil=True, cache=True)
def _scan(op, intended, issue, complete, result, counts):
    """One pass of run-level facts; fills counts[0, op] (issued) and counts[1, op] (not issued).

    Returns (first row with an unknown op or -1, first issued row completing before its issue
    or -1, earliest intended-or-issue time, last completion, completion time and errno of the
    earliest-completing failed I/O (errno 0 if none)).
    """
    bad_op = -1
    bad_time = -1
    first = np.iinfo(np.int64).max
    last = np.iinfo(np.int64).min
    err_time = np.iinfo(np.int64).max
    err_code = np.int64(0)
    for i in range(op.shape[0]):
        k = op[i]
        if k >= counts.shape[1]:
            if bad_op < 0:
                bad_op = i
            continue
        if issue[i] < 0:
            counts[1, k] += 1
            continue
        counts[0, k] += 1
        if complete[i] < issue[i] and bad_time < 0:
            bad_time = i
        first = min(first, min(intended[i], issue[i]))
        last = max(last, complete[i])
        if result[i] < 0 and (complete[i] < err_time or (complete[i] == err_time and -result[i] < err_code)):
            err_time = complete[i]
            err_code = -result[i]
    return bad_op, bad_time, first, last, err_time, err_code


# The three latencies each issued row adds, in this order, to its op's histograms.
_DEVICE, _LATENESS, _WORKLOAD = range(3)
# tallies[op, j]: issued I/Os, bytes (positive results), errors, short transfers, early issues.
_ISSUED, _BYTES, _ERRORS, _SHORT, _EARLY = range(5)


@numba.njit(
    (ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), rw(I64, 3), rw(F64, 3), rw(I64, 3),
     rw(I64, 2)),
    nogil=True, cache=True,
)
def _accumulate(op, length, intended, issue, complete, result, bins, moments, extremes, tallies):
    """One pass over a chunk that passed _scan: each issued row's three latencies counted
    into bins[op, h] (device, lateness with early issue as 0, workload), and per op and
    latency the (mean, M2) that LatencyHistogram.add would have computed from the op's
    values in row order (moments[op, h] = ref, mean, Kahan compensation, M2; the same float
    operations in the same order), their extremes, and the op's tallies.

    Rejected: a counting sort of the rows by op, then one histogram add per op and latency
    (six passes; 18 ns a row against this one's 8, on 20M rows of one op).
    """
    for i in range(op.shape[0]):
        if issue[i] < 0:
            continue
        k = op[i]
        tallies[k, _ISSUED] += 1
        r = result[i]
        if r < 0:
            tallies[k, _ERRORS] += 1
        else:
            if r > 0:
                tallies[k, _BYTES] += r
            if r < length[i]:
                tallies[k, _SHORT] += 1
        late = issue[i] - intended[i]
        if late < 0:
            tallies[k, _EARLY] += 1
        first = tallies[k, _ISSUED] == 1
        for h in range(3):
            if h == _DEVICE:
                v = complete[i] - issue[i]
            elif h == _LATENESS:
                v = max(late, 0)
            else:
                # Workload latency = device latency + lateness with early issue counted as
                # 0, so an I/O issued early is never reported faster than the device served it.
                v = complete[i] - min(intended[i], issue[i])
            bins[k, h, bin_index(v)] += 1
            if first:
                moments[k, h, 0] = float(v)
                extremes[k, h, 0] = v
                extremes[k, h, 1] = v
            d = float(v) - moments[k, h, 0]
            y = d - moments[k, h, 2]
            t = moments[k, h, 1] + y
            moments[k, h, 2] = (t - moments[k, h, 1]) - y
            moments[k, h, 1] = t
            moments[k, h, 3] += d * d
            extremes[k, h, 0] = min(extremes[k, h, 0], v)
            extremes[k, h, 1] = max(extremes[k, h, 1], v)
    for k in range(tallies.shape[0]):
        n = tallies[k, _ISSUED]
        if n == 0:
            continue
        for h in range(3):
            s = moments[k, h, 1]
            moments[k, h, 1] = moments[k, h, 0] + s / n
            moments[k, h, 3] = max(moments[k, h, 3] - s * s / n, 0.0)


class OpStats:
    """Everything counted for one op (or for all ops together)."""

    __slots__ = (
        "ios", "bytes", "errors", "errno_counts", "short_ios", "early_ios", "not_issued",
        "device", "lateness", "workload",
    )

    def __init__(self, bins=None):
        """`bins`: where the three histograms count (3, N_BINS), as RunSummary keeps them."""
        if bins is None:
            bins = np.zeros((3, N_BINS), dtype=np.int64)
        self.ios = 0  # issued I/Os, failed ones included
        self.bytes = 0  # sum of positive results
        self.errors = 0  # result < 0
        self.errno_counts = {}  # errno -> count
        self.short_ios = 0  # reads and writes with 0 <= result < length
        self.early_ios = 0  # issued before their intended time
        self.not_issued = 0  # rows the engine never issued (issue_ns == -1)
        self.device = LatencyHistogram(bins[_DEVICE])  # complete_ns - issue_ns
        self.lateness = LatencyHistogram(bins[_LATENESS])  # issue_ns - intended_ns, early ones as 0
        self.workload = LatencyHistogram(bins[_WORKLOAD])  # complete_ns - min(intended_ns, issue_ns)

    def merge(self, other):
        self.ios += other.ios
        self.bytes += other.bytes
        self.errors += other.errors
        for code, n in other.errno_counts.items():
            self.errno_counts[code] = self.errno_counts.get(code, 0) + n
        self.short_ios += other.short_ios
        self.early_ios += other.early_ios
        self.not_issued += other.not_issued
        self.device.merge(other.device)
        self.lateness.merge(other.lateness)
        self.workload.merge(other.workload)


def warm_up():
    """Load (or compile) the Numba kernels now: the first `add` otherwise spends ~0.3 s of CPU
    in the middle of a replay, on cores the engine and the kernel's I/O workers need."""
    chunk = {name: np.zeros(1, dtype=np.int64) for name in _COLUMNS}
    chunk["op"] = np.zeros(1, dtype=np.uint8)
    RunSummary().add(chunk)


class RunSummary:
    """Accumulates result chunks into per-op and run-level figures.

    Only issued rows (issue_ns >= 0) count toward I/Os, bytes, errors and latencies; rows never
    issued are counted as `not_issued` (fio's `drop_ios`). The run duration is the last
    completion minus the earliest of any intended or issue time, and every rate (IOPS, MB/s)
    of every op is over that one duration, as fio does for a job.
    """

    def __init__(self, jobname="tracereplay"):
        self.jobname = jobname
        # Every histogram's counts, [op, device/lateness/workload, bin], for _accumulate.
        self._bins = np.zeros((_N_OPS, 3, N_BINS), dtype=np.int64)
        self.ops = {op: OpStats(self._bins[op]) for op in Op}
        self._start = None  # min over issued rows of min(intended_ns, issue_ns)
        self._end = None  # max over issued rows of complete_ns
        self._first_error = None  # (complete_ns, errno) of the earliest failed completion

    # ---- accumulation -------------------------------------------------------------------

    def add_batch(self, batch):
        """Count one Arrow record batch of result rows (a results file's or journal's)."""
        self.add({name: batch.column(i).to_numpy(zero_copy_only=False) for i, name in enumerate(batch.schema.names)})

    def add(self, chunk):
        """Count one chunk: a mapping of equal-length 1-D arrays with the result columns.

        Raises ValueError, leaving the summary unchanged, if a column is missing, the
        lengths differ, an op code is unknown or an issued row completes before its issue.
        """
        missing = [name for name in _COLUMNS if name not in chunk]
        if missing:
            raise ValueError(f"result chunk lacks column(s) {missing}; it needs {list(_COLUMNS)}")
        cols = {name: np.asarray(chunk[name]) for name in _COLUMNS}
        n = len(cols["op"])
        if any(a.shape != (n,) for a in cols.values()):
            shapes = {name: a.shape for name, a in cols.items()}
            raise ValueError(f"result chunk columns must be 1-D and of equal length: {shapes}")
        if n == 0:
            return
        op = cols["op"]
        if op.dtype != np.uint8:
            if op.dtype.kind not in "iu":
                raise ValueError(f"op must be an integer column (an Op), got dtype {op.dtype}")
            bad = np.flatnonzero((op < 0) | (op >= _N_OPS))
            if bad.size:
                self._bad_op(int(op[bad[0]]), int(bad[0]))
            op = op.astype(np.uint8)
        length, intended, issue, complete, result = (
            np.ascontiguousarray(cols[name], dtype=np.int64)
            for name in ("length", "intended_ns", "issue_ns", "complete_ns", "result")
        )
        op = np.ascontiguousarray(op)

        counts = np.zeros((2, _N_OPS), dtype=np.int64)  # [issued, not issued] per op
        bad_op, bad_time, first, last, err_time, err_code = _scan(
            op, intended, issue, complete, result, counts
        )
        if bad_op >= 0:
            self._bad_op(int(op[bad_op]), bad_op)
        if bad_time >= 0:
            raise ValueError(
                f"row {bad_time} completed before it was issued (issue_ns {int(issue[bad_time])},"
                f" complete_ns {int(complete[bad_time])}); the result columns must share one"
                " monotonic clock"
            )

        # Validation is done: from here on the summary changes.
        for k in Op:
            self.ops[k].not_issued += int(counts[1, k])
        issued = int(counts[0].sum())
        if issued == 0:
            return
        self._start = first if self._start is None else min(self._start, first)
        self._end = last if self._end is None else max(self._end, last)
        if err_code > 0 and (self._first_error is None or (err_time, err_code) < self._first_error):
            self._first_error = (int(err_time), int(err_code))

        moments = np.zeros((_N_OPS, 3, 4), dtype=np.float64)
        extremes = np.zeros((_N_OPS, 3, 2), dtype=np.int64)
        tallies = np.zeros((_N_OPS, 5), dtype=np.int64)
        _accumulate(op, length, intended, issue, complete, result, self._bins, moments, extremes, tallies)
        for k in Op:
            n = int(tallies[k, _ISSUED])
            if n == 0:
                continue
            s = self.ops[k]
            s.ios += n
            s.bytes += int(tallies[k, _BYTES])
            if tallies[k, _ERRORS]:
                res = result[(op == k) & (issue >= 0)]
                codes, times = np.unique(-res[res < 0], return_counts=True)
                s.errors += int(times.sum())
                for code, t in zip(codes.tolist(), times.tolist()):
                    s.errno_counts[code] = s.errno_counts.get(code, 0) + t
            if k in _TRANSFER_OPS:
                s.short_ios += int(tallies[k, _SHORT])
            s.early_ios += int(tallies[k, _EARLY])
            for h, hist in enumerate((s.device, s.lateness, s.workload)):
                hist.combine(n, float(moments[k, h, 1]), float(moments[k, h, 3]),
                             int(extremes[k, h, 0]), int(extremes[k, h, 1]))

    @staticmethod
    def _bad_op(code, row):
        raise ValueError(
            f"unknown op code {code} at row {row}; op codes are {[f'{int(o)} {o.name}' for o in Op]}"
        )

    def merge(self, other):
        """Add everything another summary has counted (for example from another process)."""
        for k in Op:
            self.ops[k].merge(other.ops[k])
        for name, pick in (("_start", min), ("_end", max), ("_first_error", min)):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, theirs if mine is None else mine if theirs is None else pick(mine, theirs))

    # ---- figures ------------------------------------------------------------------------

    def total(self):
        """A new OpStats with all ops merged."""
        out = OpStats()
        for s in self.ops.values():
            out.merge(s)
        return out

    @property
    def duration_ns(self):
        """Last completion minus the earliest intended or issue time; 0 before any I/O."""
        return 0 if self._start is None else self._end - self._start

    @property
    def first_error(self):
        """errno of the earliest-completing failed I/O, or None."""
        return None if self._first_error is None else self._first_error[1]

    def _stats(self, op):
        return self.total() if op is None else self.ops[Op(op)]

    def iops(self, op=None):
        """Successful I/Os per second of `op` (an Op) or of all ops (None) over the run
        duration: a failed I/O is counted in `errors`, never as work done."""
        d = self.duration_ns
        s = self._stats(op)
        return (s.ios - s.errors) * 1e9 / d if d > 0 else 0.0

    def mb_per_s(self, op=None):
        """Megabytes (10**6 bytes) per second over the run duration."""
        d = self.duration_ns
        return self._stats(op).bytes * 1e3 / d if d > 0 else 0.0

    def mib_per_s(self, op=None):
        """Mebibytes (2**20 bytes) per second over the run duration."""
        d = self.duration_ns
        return self._stats(op).bytes * 1e9 / (d * 1048576) if d > 0 else 0.0

    # ---- reports ------------------------------------------------------------------------

    def to_dict(self):
        """A JSON-able dict shaped like fio's --output-format=json, plus a "tracereplay" section.

        Per op section (fio keys): io_bytes, io_kbytes, bw_bytes, bw (KiB/s), iops, runtime (ms),
        total_ios, short_ios, drop_ios (rows never issued), clat_ns (device latency), lat_ns
        (workload latency, from the intended time); ours: errors, early_ios, lateness_ns.
        fio's "sync" section has only total_ios and lat_ns; ours has the full set.
        """
        d = self.duration_ns
        total = self.total()
        first = self.first_error
        job = {
            "jobname": self.jobname,
            "groupid": 0,
            # fio's job "error" is the errno that failed the job; a replay continues past
            # failed I/Os (fio's continue_on_error), so report the first one as fio then does.
            "error": first or 0,
            "total_err": total.errors,
            "first_error": first or 0,
        }
        for k in Op:
            job[FIO_SECTIONS[k]] = _op_section(self.ops[k], d)
        job["job_runtime"] = _ms(d)
        errors_by_errno = {
            errno_name(code): n for code, n in sorted(total.errno_counts.items())
        }
        return {
            "jobs": [job],
            "tracereplay": {
                "duration_ns": d,
                "total_ios": total.ios,
                "io_bytes": total.bytes,
                "iops": self.iops(),
                "mb_per_s": self.mb_per_s(),
                "mib_per_s": self.mib_per_s(),
                "not_issued": total.not_issued,
                "early_ios": total.early_ios,
                "short_ios": total.short_ios,
                "errors": total.errors,
                "errors_by_errno": errors_by_errno,
                "ops": {
                    k.name.lower(): {
                        "total_ios": self.ops[k].ios,
                        "iops": self.iops(k),
                        "mb_per_s": self.mb_per_s(k),
                        "mib_per_s": self.mib_per_s(k),
                    }
                    for k in Op
                },
                "all": _op_section(total, d),
            },
        }

    def format_table(self):
        """A compact console table: one row per op that occurred, then errors if any."""
        table = [["op", "I/Os", "IOPS", "MB/s", "|", "dev p50", "p90", "p99", "p99.9", "max", "|",
                  "late p50", "p99", "max"]]
        rows = [(k.name.lower(), self.ops[k], k) for k in Op if self.ops[k].ios]
        total = self.total()
        if len(rows) > 1:
            rows.append(("all", total, None))
        for name, s, k in rows:
            dev = s.device.percentiles((50, 90, 99, 99.9)) + [s.device.max]
            late = s.lateness.percentiles((50, 99)) + [s.lateness.max]
            table.append([name, str(s.ios), _human_rate(self.iops(k)), _human_rate(self.mb_per_s(k)),
                          "|", *map(_human_ns, dev), "|", *map(_human_ns, late)])
        lines = [f"duration {_human_ns(self.duration_ns)}, {total.ios} I/Os", *_aligned(table, _WIDTHS)]
        notes = []
        if total.errors:
            by = ", ".join(f"{errno_name(c)} {n}" for c, n in sorted(total.errno_counts.items()))
            notes.append(f"errors {total.errors} ({by})")
        if total.short_ios:
            notes.append(f"short transfers {total.short_ios}")
        if total.not_issued:
            notes.append(f"not issued {total.not_issued}")
        if notes:
            lines.append(", ".join(notes))
        return "\n".join(lines)


# The table's usual column widths; a wider value widens its column, never joins the next.
_WIDTHS = (8, 10, 10, 9, 3, 9, 9, 9, 9, 9, 3, 9, 9, 9)


def _aligned(table, widths):
    """Lines of `table` (rows of cells): the first column left-aligned, the others right-aligned
    with at least one space between columns, each at least its width in `widths`."""
    widths = [max(w, max(len(row[i]) for row in table) + 1) for i, w in enumerate(widths)]
    return [row[0].ljust(widths[0]) + "".join(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))
            for row in table]


def _ms(ns):
    return int(round(ns / 1e6))


def _lat_section(h):
    """fio's latency block: min/max/mean/stddev/N, and percentile when there are samples."""
    out = {
        "min": h.min or 0,
        "max": h.max or 0,
        "mean": h.mean or 0.0,
        "stddev": h.stddev or 0.0,
        "N": h.count,
    }
    if h.count:
        values = h.percentiles(FIO_PERCENTILES)
        out["percentile"] = {f"{q:.6f}": v for q, v in zip(FIO_PERCENTILES, values)}
    return out


def _op_section(s, duration_ns):
    if duration_ns > 0:
        bw_bytes = s.bytes * 10**9 // duration_ns  # integer, as fio reports it
        iops = (s.ios - s.errors) * 1e9 / duration_ns  # failed I/Os are no work done
    else:
        bw_bytes, iops = 0, 0.0
    return {
        "io_bytes": s.bytes,
        "io_kbytes": s.bytes >> 10,
        "bw_bytes": bw_bytes,
        "bw": bw_bytes >> 10,
        "iops": iops,
        "runtime": _ms(duration_ns) if s.ios else 0,
        "total_ios": s.ios,
        "short_ios": s.short_ios,
        "drop_ios": s.not_issued,
        "errors": s.errors,
        "early_ios": s.early_ios,
        "clat_ns": _lat_section(s.device),
        "lat_ns": _lat_section(s.workload),
        "lateness_ns": _lat_section(s.lateness),
    }


def _human_ns(ns):
    if ns is None:
        return "-"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f}ms"
    return f"{ns / 1e9:.2f}s"


def _human_rate(x):
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"
