"""How the reviews score the standard tests: per-second IOPS, SNIA PTS steady state, the
consistency of the last 400 s, and Aerospike ACT's latency limits and search for the score.

Everything starts from `Bins`, per-interval counts accumulated from results chunks one at a
time, so memory is a few integers per second of run, whatever the number of I/Os.
"""
import math
from dataclasses import dataclass, field

import numba
import numpy as np

from traces.kernel_types import BOOL, I64, U8, ro_c, rw
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

SECOND_NS = 1_000_000_000
MS_NS = 1_000_000
_COLUMNS = ("op", "length", "intended_ns", "issue_ns", "complete_ns", "result")
assert all(name in TRACE_COLUMNS or name in RESULT_COLUMNS for name in _COLUMNS)

# ACT passes a load if, in every hour, fewer than these shares of transactions take longer.
ACT_LIMITS = ((1 * MS_NS, 0.05), (8 * MS_NS, 0.01), (64 * MS_NS, 0.001))
ACT_PERIOD_S = 3600
# PTS 2.0.2 steady state: 5-round window, data excursion <= 20 %, slope excursion <= 10 %.
PTS_WINDOW = 5
PTS_MAX_EXCURSION = 0.20
PTS_MAX_SLOPE_EXCURSION = 0.10
PTS_MAX_ROUNDS = 25
CONSISTENCY_WINDOW_S = 400
SLOW_NS = 10 * MS_NS
# Seed 002's latency distribution: the share of I/Os per device-latency range, the last one
# above SLOW_NS (">10 ms", the consistency warning). The page does not give its ranges; these
# are ours, 1-2-5 steps from 50 us.
LATENCY_RANGES_NS = (50_000, 100_000, 200_000, 500_000, 1 * MS_NS, 2 * MS_NS, 5 * MS_NS, SLOW_NS)


# What Bins measures per I/O (its `latency_from`): complete - issue (the device's latency),
# complete - intended (what an open-loop workload sees), or issue - intended (the replayer's
# own lateness: how late it issued, which an open-loop test's limits count against the drive).
_LATENCY_FROM = {"issue": 0, "intended": 1, "lateness": 2}


@numba.njit(
    (ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(BOOL), I64, BOOL, I64,
    I64, ro_c(I64), rw(I64), rw(I64, 2), rw(I64)),
    nogil=True, cache=True,
)
def _bin_rows(op, length, intended, issue, complete, result, op_mask, max_length,
              by_intended, latency_mode, bin_ns, thresholds, counts, over, errors):
    """One pass over a chunk; returns rows never issued. Per bin: successful completions
    (counts), those slower than each threshold (over[j]) and failed I/Os (errors)."""
    not_issued = 0
    for i in range(op.shape[0]):
        k = op[i]
        if k >= op_mask.shape[0] or not op_mask[k] or (max_length >= 0 and length[i] > max_length):
            continue
        if issue[i] < 0:
            not_issued += 1
            continue
        t = intended[i] if by_intended else complete[i]
        b = max(t, 0) // bin_ns
        if result[i] < 0:
            errors[b] += 1
            continue
        counts[b] += 1
        if latency_mode == 2:
            latency = issue[i] - intended[i]
        elif latency_mode == 1:
            latency = complete[i] - intended[i]
        else:
            latency = complete[i] - issue[i]
        for j in range(thresholds.shape[0]):
            if latency > thresholds[j]:
                over[j, b] += 1
    return not_issued


class Bins:
    """Per-interval counts of completed I/Os, accumulated from results chunks by `add`.

    An I/O counts in the bin of its completion (`by="complete"`, for IOPS) or of its intended
    time (`by="intended"`, for ACT, which scores each hour's transactions). Its latency is
    complete - issue (`latency_from="issue"`, the device's), complete - intended
    (`"intended"`, what an open-loop client sees) or issue - intended (`"lateness"`, the
    replayer's own delay); `over[j]` counts latencies strictly above
    `thresholds_ns[j]`. Only `ops` count, and with `max_length` only I/Os that long or
    shorter. Failed I/Os (result < 0) are counted in `errors`, not in `counts`; rows never
    issued (issue_ns < 0, an interrupted run) in `not_issued`. The last bin may be partial.
    """

    def __init__(self, bin_ns=SECOND_NS, thresholds_ns=(), *, by="complete",
                 latency_from="issue", ops=(Op.READ, Op.WRITE), max_length=None):
        if by not in ("complete", "intended") or latency_from not in _LATENCY_FROM:
            raise ValueError("by is 'complete' or 'intended'; latency_from 'issue', 'intended' "
                             "or 'lateness'")
        self.bin_ns = int(bin_ns)
        if self.bin_ns < 1:
            raise ValueError(f"bin_ns must be at least 1, not {bin_ns}")
        self.thresholds_ns = np.array(sorted(int(t) for t in thresholds_ns), dtype=np.int64)
        self.by, self.latency_from = by, latency_from
        self._op_mask = np.zeros(len(Op), dtype=np.bool_)
        self._op_mask[[int(o) for o in ops]] = True
        self.max_length = -1 if max_length is None else int(max_length)
        self.counts = np.zeros(0, dtype=np.int64)
        self.over = np.zeros((len(self.thresholds_ns), 0), dtype=np.int64)
        self.errors = np.zeros(0, dtype=np.int64)
        self.not_issued = 0

    @classmethod
    def from_chunks(cls, chunks, *args, **kwargs) -> "Bins":
        bins = cls(*args, **kwargs)
        for chunk in chunks:
            bins.add(chunk)
        return bins

    def add(self, chunk) -> None:
        missing = [name for name in _COLUMNS if name not in chunk]
        if missing:
            raise ValueError(f"result chunk lacks column(s) {missing}; it needs {list(_COLUMNS)}")
        op = np.ascontiguousarray(chunk["op"], dtype=np.uint8)
        length, intended, issue, complete, result = (
            np.ascontiguousarray(chunk[name], dtype=np.int64) for name in _COLUMNS[1:]
        )
        if not len(op):
            return
        times = intended if self.by == "intended" else complete
        needed = int(max(times.max(), 0)) // self.bin_ns + 1
        if needed > len(self.counts):
            self._grow(max(needed, 2 * len(self.counts)))
        self.not_issued += _bin_rows(
            op, length, intended, issue, complete, result, self._op_mask, self.max_length,
            self.by == "intended", _LATENCY_FROM[self.latency_from], self.bin_ns,
            self.thresholds_ns, self.counts, self.over, self.errors,
        )

    def _grow(self, size):
        pad = size - len(self.counts)
        self.counts = np.concatenate([self.counts, np.zeros(pad, np.int64)])
        self.errors = np.concatenate([self.errors, np.zeros(pad, np.int64)])
        self.over = np.concatenate([self.over, np.zeros((len(self.over), pad), np.int64)], axis=1)

    def used(self) -> int:
        """Bins up to the last one holding any I/O (growth leaves empty bins after it)."""
        busy = np.flatnonzero((self.counts > 0) | (self.errors > 0))
        return int(busy[-1]) + 1 if busy.size else 0

    def full_bins(self, duration_ns=None) -> int:
        """How many bins a run of `duration_ns` fills completely; without it, the bins used."""
        if duration_ns is None:
            return self.used()
        return int(duration_ns) // self.bin_ns

    def rate(self, duration_ns=None) -> np.ndarray:
        """Completions per second in each bin; with `duration_ns` (the run's length; for an
        interrupted run, up to where it stopped) only the bins wholly inside it."""
        n = self.full_bins(duration_ns)
        counts = np.zeros(n, dtype=np.int64)
        have = min(n, len(self.counts))
        counts[:have] = self.counts[:have]
        return counts * (SECOND_NS / self.bin_ns)


def iops_series(chunks, *, ops=(Op.READ, Op.WRITE), bin_ns=SECOND_NS, duration_ns=None) -> np.ndarray:
    """Per-second IOPS (per `bin_ns`, scaled to per second) of results chunks, by completion."""
    return Bins.from_chunks(chunks, bin_ns, ops=ops).rate(duration_ns)


def round_averages(series, round_bins: int) -> np.ndarray:
    """Averages of consecutive whole rounds of `round_bins` values; a partial last round (an
    interrupted run) is dropped."""
    series = np.asarray(series, dtype=np.float64)
    round_bins = int(round_bins)
    if round_bins < 1:
        raise ValueError(f"a round must be at least one value long, not {round_bins}")
    rounds = len(series) // round_bins
    return series[: rounds * round_bins].reshape(rounds, round_bins).mean(axis=1)


# ---- SNIA PTS steady state ------------------------------------------------------------------


@dataclass
class RoundCheck:
    """The steady-state check of the window ending at round `round` (1-based)."""

    round: int
    value: float
    window: tuple[int, int] | None = None  # first and last round of the window, 1-based
    average: float | None = None
    excursion: float | None = None  # (max - min) / average
    slope_excursion: float | None = None  # (max - min of the fitted line) / average
    steady: bool = False


@dataclass
class SteadyState:
    """PTS steady state over per-round values: the check at every round, and the outcome."""

    rounds: list[RoundCheck]
    steady_round: int | None  # first round whose window is steady (1-based), None if never
    status: str  # "steady", "not steady" (gave up after max_rounds), "too few rounds"

    @property
    def steady(self) -> bool:
        return self.steady_round is not None

    @property
    def window(self) -> RoundCheck | None:
        return self.rounds[self.steady_round - 1] if self.steady_round else None


def steady_state(values, *, window=PTS_WINDOW, max_excursion=PTS_MAX_EXCURSION,
                 max_slope_excursion=PTS_MAX_SLOPE_EXCURSION, max_rounds=PTS_MAX_ROUNDS) -> SteadyState:
    """SNIA PTS 2.0.2 steady state of the tracked variable, one value per round.

    From round `window` on, the window is the last `window` rounds; it is steady when
    max - min <= max_excursion x its average, and the least-squares line over it changes by
    no more than max_slope_excursion x the average across the window. The first steady round
    ends the test; after `max_rounds` rounds without one it gives up ("not steady"). Rounds
    after the steady one or after `max_rounds` are ignored. A window averaging 0 or less (a
    drive doing nothing) is never steady. Fewer rounds than `max_rounds` and none steady is
    "too few rounds": a run stopped before the test could end.
    """
    values = np.asarray(values, dtype=np.float64)[: int(max_rounds)]
    checks: list[RoundCheck] = []
    x = np.arange(window, dtype=np.float64)
    sx2 = float(((x - x.mean()) ** 2).sum())
    for i, value in enumerate(values):
        check = RoundCheck(round=i + 1, value=float(value))
        checks.append(check)
        if i + 1 < window:
            continue
        y = values[i + 1 - window: i + 1]
        average = float(y.mean())
        # Least-squares slope in closed form: exactly 0 for a flat window, unlike polyfit.
        slope = float(((x - x.mean()) * (y - average)).sum() / sx2) if window > 1 else 0.0
        check.window = (i + 2 - window, i + 1)
        check.average = average
        if average > 0:
            check.excursion = float(y.max() - y.min()) / average
            check.slope_excursion = abs(slope) * (window - 1) / average
            check.steady = (check.excursion <= max_excursion
                            and check.slope_excursion <= max_slope_excursion)
        if check.steady:
            return SteadyState(checks, i + 1, "steady")
    status = "not steady" if len(values) >= max_rounds else "too few rounds"
    return SteadyState(checks, None, status)


# ---- consistency --------------------------------------------------------------------------


@dataclass
class Consistency:
    """The last `window_s` seconds of a sustained-write run, as the reviews score it."""

    seconds: int  # seconds actually in the window (fewer than asked for a short run)
    short: bool  # the run was shorter than the window asked for
    average_iops: float | None  # None for an empty window
    stddev_iops: float | None  # population standard deviation of the per-second IOPS
    consistency: float | None  # average / stddev; inf when every second is equal
    slow_share: float | None  # share of the window's I/Os over the slow threshold
    slow_share_run: float | None  # the same over the whole run
    slow_ns: int


def consistency(bins: Bins, *, window_s=CONSISTENCY_WINDOW_S, duration_ns=None,
                slow_ns=SLOW_NS) -> Consistency:
    """Average IOPS, average / standard deviation and the share of I/Os over `slow_ns` in the
    last `window_s` whole seconds. `bins` must be per second and have `slow_ns` among its
    thresholds (build it with `consistency_bins`)."""
    if bins.bin_ns != SECOND_NS:
        raise ValueError("consistency needs per-second bins")
    hits = np.flatnonzero(bins.thresholds_ns == int(slow_ns))
    if not hits.size:
        raise ValueError(f"the bins have no {slow_ns} ns threshold; build them with consistency_bins")
    j = int(hits[0])
    iops = bins.rate(duration_ns)
    seconds = min(int(window_s), len(iops))
    start = len(iops) - seconds
    stop = start + seconds
    window = iops[start:]
    full, over = _counted(bins, len(iops))
    slow = over[j]
    n_window, n_run = int(full[start:stop].sum()), int(full.sum())
    if seconds == 0:
        average = stddev = ratio = None
    else:
        average, stddev = float(window.mean()), float(window.std())
        ratio = average / stddev if stddev > 0 else (math.inf if average > 0 else None)
    return Consistency(
        seconds=seconds, short=seconds < int(window_s), average_iops=average,
        stddev_iops=stddev, consistency=ratio,
        slow_share=int(slow[start:stop].sum()) / n_window if n_window else None,
        slow_share_run=int(slow.sum()) / n_run if n_run else None, slow_ns=int(slow_ns),
    )


def _counted(bins: Bins, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, over) of the first `n` bins, zeros past those the run filled."""
    have = min(n, len(bins.counts))
    full = np.zeros(n, dtype=np.int64)
    full[:have] = bins.counts[:have]
    over = np.zeros((len(bins.thresholds_ns), n), dtype=np.int64)
    over[:, :have] = bins.over[:, :have]
    return full, over


def latency_distribution(bins: Bins, *, window_s=CONSISTENCY_WINDOW_S, duration_ns=None) -> dict:
    """I/Os per device-latency range in the last `window_s` whole seconds, the window
    `consistency` scores: {"edges_ns": the bins' thresholds, "counts": one more than the
    edges, I/Os at or below edges_ns[0], in (edges_ns[i - 1], edges_ns[i]], above the last}.
    Build the bins with `consistency_bins` for LATENCY_RANGES_NS."""
    n = len(bins.rate(duration_ns))
    start = n - min(int(window_s), n)
    full, over = _counted(bins, n)
    total = int(full[start:].sum())
    above = [int(x) for x in over[:, start:].sum(axis=1)]
    counts = [total - (above[0] if above else 0)]
    counts += [a - b for a, b in zip(above, above[1:])] + above[-1:]
    return {"edges_ns": [int(t) for t in bins.thresholds_ns], "counts": counts}


def consistency_bins(slow_ns=SLOW_NS, ops=(Op.READ, Op.WRITE)) -> Bins:
    """Per-second bins by completion with device latency over `slow_ns` and over each of
    LATENCY_RANGES_NS counted."""
    return Bins(SECOND_NS, sorted({*LATENCY_RANGES_NS, int(slow_ns)}), ops=ops)


# ---- QoS -----------------------------------------------------------------------------------

QOS_THRESHOLDS_NS = (1 * MS_NS, 8 * MS_NS, 64 * MS_NS)


@dataclass
class QosPeriod:
    index: int  # 0-based
    start_s: float
    seconds: float  # its length; shorter than the period for a partial last one
    ios: int  # successful I/Os in the period
    errors: int
    shares: dict  # threshold_ns -> share of the period's I/Os slower than it (None if no I/O)


def qos_bins(thresholds_ns=QOS_THRESHOLDS_NS, *, bin_ns=SECOND_NS, by="complete",
             latency_from="issue", ops=(Op.READ, Op.WRITE)) -> Bins:
    """Bins counting I/Os over each of `thresholds_ns` (any number, any values): device latency
    by default, or latency from the intended time (what the workload saw) with
    latency_from="intended"."""
    return Bins(bin_ns, thresholds_ns, by=by, latency_from=latency_from, ops=ops)


def qos(bins: Bins, *, period_s=1, duration_ns=None) -> list[QosPeriod]:
    """Per period of `period_s` seconds (a whole number of bins), the share of I/Os slower
    than each of the bins' thresholds, ACT's test generalised to any thresholds and period."""
    period_bins = max(1, int(round(period_s * SECOND_NS / bins.bin_ns)))
    total = bins.used() if duration_ns is None else -(-int(duration_ns) // bins.bin_ns)
    out = []
    for p, start in enumerate(range(0, total, period_bins)):
        stop = min(start + period_bins, total)
        n = int(bins.counts[start:stop].sum())
        shares = {int(t): (int(bins.over[j, start:stop].sum()) / n if n else None)
                  for j, t in enumerate(bins.thresholds_ns)}
        end = stop * bins.bin_ns if duration_ns is None else min(stop * bins.bin_ns, int(duration_ns))
        out.append(QosPeriod(p, start * bins.bin_ns / SECOND_NS, (end - start * bins.bin_ns) / SECOND_NS,
                             n, int(bins.errors[start:stop].sum()), shares))
    return out


# ---- Aerospike ACT ------------------------------------------------------------------------


@dataclass
class ActPeriod:
    index: int  # 0-based
    start_s: float
    seconds: float  # its length; shorter than the period for a partial last one
    transactions: int
    errors: int
    shares: tuple  # share of transactions over each limit's latency, in ACT_LIMITS order
    passed: bool
    partial: bool


@dataclass
class ActCheck:
    passed: bool
    reason: str  # why it failed, or "" when it passed
    periods: list[ActPeriod] = field(default_factory=list)


# Which ACT's latency: the queue-era ACT of seed 000 (versions before 5) timed a transaction
# from when it was due, its wait in ACT's queue included; ACT 6 times the device's read
# alone (and opens the device O_DSYNC). "intended" is the first, "issue" the second.
ACT_LATENCY = {
    "intended": "queue-era ACT (seed 000's): from the time each transaction was due, queue wait included",
    "issue": "ACT 6: device latency, from issue to completion",
}
# ACT gives up on a run whose request queues pass max-reqs-queued (100,000 by default) or
# whose large-block reads and writes fall more than max-lag-sec (10 s) behind schedule.
ACT_MAX_QUEUED = 100_000
ACT_MAX_LAG_NS = 10 * SECOND_NS


def act_bins(transaction_max_length=None, limits=ACT_LIMITS, latency_from="intended") -> Bins:
    """Per-second bins of ACT transactions (reads up to `transaction_max_length` bytes, the
    large-block reads excluded) by intended time, latency counted from the intended time
    (the queue-era ACT) or, with latency_from="issue", from issue (ACT 6); see ACT_LATENCY.
    With latency_from="lateness" they count the replayer's own lateness against the limits."""
    return Bins(SECOND_NS, [t for t, _ in limits], by="intended", latency_from=latency_from,
                ops=(Op.READ,), max_length=transaction_max_length)


class ActGaveUp(Exception):
    """ACT's early stop: the run fell too far behind to go on; the message says how far."""


class ActWatch:
    """ACT's early stop, told every results chunk as it is written (a runner consumer):
    raises ActGaveUp once requests due but not yet issued pass `max_queued` (estimated for
    each transaction as its issue lateness x the load's I/O rate: what became due while it
    waited) or a large-block I/O is issued more than `max_lag_ns` late."""

    def __init__(self, rate, transaction_max_length, max_queued=ACT_MAX_QUEUED,
                 max_lag_ns=ACT_MAX_LAG_NS):
        self.rate, self.small = float(rate), int(transaction_max_length)
        self.max_queued, self.max_lag_ns = int(max_queued), int(max_lag_ns)
        self.queued = 0.0  # the most requests found waiting so far
        self.lag_ns = 0  # the most a large-block I/O was late so far

    def add(self, chunk) -> None:
        issue = np.asarray(chunk["issue_ns"], dtype=np.int64)
        issued = issue >= 0
        late = issue - np.asarray(chunk["intended_ns"], dtype=np.int64)
        small = np.asarray(chunk["length"]) <= self.small
        txn, large = late[issued & small], late[issued & ~small]
        if txn.size:
            self.queued = max(self.queued, float(txn.max()) * self.rate / SECOND_NS)
        if large.size:
            self.lag_ns = max(self.lag_ns, int(large.max()))
        if self.queued > self.max_queued:
            raise ActGaveUp(f"about {self.queued:,.0f} requests were queued, over ACT's bound "
                            f"of {self.max_queued:,}: the target cannot keep up with the load")
        if self.lag_ns > self.max_lag_ns:
            raise ActGaveUp(f"large-block I/O fell {self.lag_ns / SECOND_NS:.1f} s behind "
                            f"schedule, over ACT's {self.max_lag_ns / SECOND_NS:g} s")


def act_check(bins: Bins, *, period_s=ACT_PERIOD_S, duration_ns=None, limits=ACT_LIMITS) -> ActCheck:
    """ACT's verdict: in every whole period (an hour), under each limit's share of the
    transactions take longer than its latency (< 5 % over 1 ms, < 1 % over 8 ms, < 0.1 % over
    64 ms), with no failed transaction, and at least one whole period ran. A partial last
    period is reported, not scored. `duration_ns` is the run's intended length (for an
    interrupted run, where it stopped); without it the run ends with its last transaction."""
    thresholds = [int(t) for t, _ in limits]
    index = [int(np.flatnonzero(bins.thresholds_ns == t)[0]) if t in bins.thresholds_ns else -1
             for t in thresholds]
    if -1 in index:
        raise ValueError(f"the bins lack a threshold of {thresholds}; build them with act_bins")
    if bins.by != "intended" or bins.latency_from not in ACT_LATENCY:
        raise ValueError("ACT scores transactions by their intended time, with latency from the "
                         "intended time or the issue; build the bins with act_bins")
    period_bins = max(1, int(round(period_s * SECOND_NS / bins.bin_ns)))
    total_bins = (bins.used() if duration_ns is None
                  else -(-int(duration_ns) // bins.bin_ns))
    periods, failures = [], []
    for p, start in enumerate(range(0, total_bins, period_bins)):
        stop = min(start + period_bins, total_bins)
        partial = stop - start < period_bins or (
            duration_ns is not None and stop * bins.bin_ns > int(duration_ns))
        n = int(bins.counts[start:stop].sum())
        errors = int(bins.errors[start:stop].sum())
        shares = tuple(int(bins.over[j, start:stop].sum()) / n if n else math.nan for j in index)
        ok = n > 0 and errors == 0 and all(s < limit for s, (_, limit) in zip(shares, limits))
        seconds = ((min(stop * bins.bin_ns, int(duration_ns)) if duration_ns is not None
                    else stop * bins.bin_ns) - start * bins.bin_ns) / SECOND_NS
        periods.append(ActPeriod(p, start * bins.bin_ns / SECOND_NS, seconds, n, errors,
                                 shares, ok, partial))
        if not partial and not ok:
            failures.append(periods[-1])
    whole = [p for p in periods if not p.partial]
    if not whole:
        return ActCheck(False, "no whole period ran", periods)
    if failures:
        first = failures[0]
        if first.transactions == 0:
            why = "no transactions"
        elif first.errors:
            why = f"{first.errors} failed transactions"
        else:
            why = ", ".join(
                f"{s:.3%} over {t / MS_NS:g} ms (limit {limit:.1%})"
                for s, (t, limit) in zip(first.shares, limits) if not s < limit)
        return ActCheck(False, f"period {first.index + 1}: {why}", periods)
    return ActCheck(True, "", periods)


@dataclass
class ActSearch:
    score: int  # highest passing multiple; 0 if none passed
    tried: list  # (multiple, passed) in the order run
    at_start: bool  # the start multiple passed: start higher to find the true score


def act_search(run, *, start=150, step=10, resolution=1, minimum=1) -> ActSearch:
    """The ACT score: the highest multiple at which `run(multiple)` passes (truthy).

    As the reviews do, it starts high (`start`, 150x) and steps down by `step` until a run
    passes, then narrows the gap to the failing multiple above it by bisection, down to
    `resolution`, assuming a drive that passes a load passes every lighter one. Tries
    `minimum` last; if that fails, the score is 0.
    """
    start, step, resolution, minimum = (int(v) for v in (start, step, resolution, minimum))
    if not (1 <= minimum <= start and step >= 1 and resolution >= 1):
        raise ValueError("need 1 <= minimum <= start, step >= 1 and resolution >= 1")
    tried = []

    def attempt(m):
        ok = bool(run(m))
        tried.append((m, ok))
        return ok

    m, failed = start, None
    while not attempt(m):
        if m == minimum:
            return ActSearch(0, tried, False)
        m, failed = max(minimum, m - step), m
    if failed is None:
        return ActSearch(start, tried, True)
    lo, hi = m, failed  # lo passed, hi failed
    while hi - lo > resolution:
        mid = lo + max(resolution, (hi - lo) // 2 // resolution * resolution)  # < hi
        if attempt(mid):
            lo = mid
        else:
            hi = mid
    return ActSearch(lo, tried, False)
