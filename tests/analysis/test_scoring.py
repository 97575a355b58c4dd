"""Scoring on hand-made results and series with known answers: per-second bins, SNIA PTS
steady state, consistency, ACT's per-period limits and its step-down search."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.scoring import (
    ACT_LATENCY, ActGaveUp, ActWatch, Bins, act_bins, act_check, act_search, consistency,
    consistency_bins, iops_series, round_averages, steady_state,
)
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

S, MS = 1_000_000_000, 1_000_000
COLUMNS = ("op", "length", *RESULT_COLUMNS)
R, W, F = Op.READ, Op.WRITE, Op.FLUSH


def chunk(rows):
    """Rows of (op, length, intended_ns, issue_ns, complete_ns, result) -> a result chunk."""
    cols = list(zip(*rows)) if rows else [()] * len(COLUMNS)
    dtypes = {**TRACE_COLUMNS, **RESULT_COLUMNS}
    return {name: np.array(c, dtype=dtypes[name]) for name, c in zip(COLUMNS, cols)}


def ios(n, second, latency_ns=100_000, op=W, length=4096, late_ns=0):
    """n I/Os intended in `second`, issued `late_ns` later, served in `latency_ns`."""
    rows = []
    for i in range(n):
        intended = second * S + i * (S // max(n, 1)) // 2
        issue = intended + late_ns
        rows.append((op, length, intended, issue, issue + latency_ns, length))
    return rows


# ---- bins ------------------------------------------------------------------------------


def test_bins_count_completions_latencies_errors_and_unissued():
    rows = [
        (R, 4096, 0, 10, 5 * MS, 4096),  # second 0, device 5 ms - 10 ns
        (W, 4096, 0, 0, 20 * MS, 4096),  # second 0, over 10 ms
        (W, 4096, 0, 0, S + 1, 4096),  # completes in second 1, over 10 ms
        (F, 0, 0, 0, 100, 0),  # flushes are not counted by default
        (R, 4096, 2 * S, 2 * S, 2 * S + 1, -5),  # failed, second 2
        (R, 4096, 3 * S, -1, -1, -1),  # never issued
    ]
    bins = Bins(S, (10 * MS, MS))
    bins.add(chunk(rows))
    assert bins.counts[:3].tolist() == [2, 1, 0]
    assert bins.thresholds_ns.tolist() == [MS, 10 * MS]
    assert bins.over[:, :3].tolist() == [[2, 1, 0], [1, 1, 0]]
    assert bins.errors[:3].tolist() == [0, 0, 1]
    assert bins.not_issued == 1
    assert bins.used() == 3 and bins.rate().tolist() == [2, 1, 0]
    assert bins.rate(duration_ns=2 * S - 1).tolist() == [2]  # only whole seconds
    assert bins.rate(duration_ns=5 * S).tolist() == [2, 1, 0, 0, 0]


def test_bins_by_intended_time_from_intended_and_by_length():
    rows = [(R, 1536, S - 1, S + 5 * MS, S + 6 * MS, 1536),  # due in second 0, 6 ms late
            (R, 131072, 0, 0, 100 * MS, 131072)]  # a large-block read: not a transaction
    bins = act_bins(transaction_max_length=65536)
    bins.add(chunk(rows))
    assert bins.counts[0] == 1 and bins.counts[1:].sum() == 0 and bins.used() == 1
    assert bins.over[:, 0].tolist() == [1, 0, 0]  # over 1 ms, not over 8 ms


def test_empty_chunks_and_empty_bins():
    bins = Bins()
    bins.add(chunk([]))
    assert bins.used() == 0 and bins.rate().tolist() == []
    assert iops_series([]).tolist() == []


def test_a_chunk_without_result_columns_is_refused():
    with pytest.raises(ValueError, match="lacks column"):
        Bins().add({"op": np.zeros(1, np.uint8)})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([R, W, F]), st.integers(0, 10 * S),
                          st.integers(0, 50 * MS), st.booleans(), st.booleans()), max_size=200),
       st.integers(1, 50))
def test_bins_match_a_numpy_reference_whatever_the_chunking(rows, split):
    data = [(op, 4096, t, t if issued else -1, t + lat if issued else -1, 4096 if ok else -5)
            for op, t, lat, issued, ok in rows]
    whole = Bins(S, (MS, 8 * MS))
    whole.add(chunk(data))
    parts = Bins(S, (MS, 8 * MS))
    for i in range(0, len(data), split):
        parts.add(chunk(data[i:i + split]))
    c = chunk(data)
    counted = np.isin(c["op"], [R, W]) & (c["issue_ns"] >= 0) & (c["result"] >= 0)
    done = c["complete_ns"][counted] // S
    n = whole.used()
    assert whole.counts[:n].tolist() == np.bincount(done, minlength=n)[:n].tolist()
    latency = (c["complete_ns"] - c["issue_ns"])[counted]
    for j, thr in enumerate((MS, 8 * MS)):
        assert whole.over[j, :n].tolist() == np.bincount(done[latency > thr], minlength=n)[:n].tolist()
    assert whole.not_issued == int((np.isin(c["op"], [R, W]) & (c["issue_ns"] < 0)).sum())
    assert parts.used() == n
    assert parts.counts[:n].tolist() == whole.counts[:n].tolist()
    assert parts.over[:, :n].tolist() == whole.over[:, :n].tolist()


def test_iops_series_and_round_averages():
    rows = ios(3, 0) + ios(5, 1) + ios(4, 2) + ios(6, 3) + ios(1, 4)
    series = iops_series([chunk(rows)], duration_ns=4 * S + S // 2)  # stopped mid-second 4
    assert series.tolist() == [3, 5, 4, 6]
    assert round_averages(series, 2).tolist() == [4, 5]
    assert round_averages(series, 3).tolist() == [4]  # the partial round is dropped
    assert round_averages([], 60).tolist() == []


# ---- steady state ----------------------------------------------------------------------


def test_a_flat_series_is_steady_at_round_five():
    result = steady_state([1000] * 8)
    assert result.status == "steady" and result.steady_round == 5
    assert len(result.rounds) == 5 and result.window.window == (1, 5)
    assert result.window.excursion == 0 and result.window.slope_excursion == 0


def test_steady_after_a_transient_reports_every_round():
    values = [5000, 3000, 1500, 1000, 1050, 950, 1000, 1000, 1020]
    result = steady_state(values)
    # Window 4..8 (1000, 1050, 950, 1000, 1000): excursion 100 / 1000 = 10 %, slope ~0.
    assert result.steady_round == 8 and result.window.window == (4, 8)
    assert [r.steady for r in result.rounds] == [False] * 7 + [True]
    assert result.rounds[3].window is None and result.rounds[4].window == (1, 5)
    assert result.rounds[7].average == pytest.approx(1000)
    assert result.rounds[7].excursion == pytest.approx(0.10)


@pytest.mark.parametrize("spread,steady", [(0.20, True), (0.2001, False)])
def test_data_excursion_limit_is_twenty_percent_of_the_average(spread, steady):
    # Symmetric around 100 with a zero slope: only the excursion decides.
    half = 100 * spread / 2
    values = [100 - half, 100 + half, 100, 100 + half, 100 - half]
    check = steady_state(values).rounds[4]
    assert check.slope_excursion == pytest.approx(0, abs=1e-12)
    assert check.excursion == pytest.approx(spread)
    assert check.steady is steady


@pytest.mark.parametrize("step,steady", [(2.5, True), (2.7, False)])
def test_slope_excursion_limit_is_ten_percent_of_the_average(step, steady):
    values = [100 + step * i for i in range(5)]  # a straight ramp: fitted line = data
    check = steady_state(values).rounds[4]
    assert check.slope_excursion == pytest.approx(4 * step / (100 + 2 * step))
    assert check.excursion == pytest.approx(check.slope_excursion)
    assert check.steady is steady


def test_never_steady_gives_up_after_25_rounds():
    values = [100 * (1 + (i % 2)) for i in range(40)]  # 100, 200, 100, ...
    result = steady_state(values)
    assert result.status == "not steady" and not result.steady
    assert len(result.rounds) == 25 and result.steady_round is None


def test_an_interrupted_or_empty_run_has_too_few_rounds():
    assert steady_state([100, 100, 100]).status == "too few rounds"
    assert steady_state([300, 100, 500, 100, 300, 100]).status == "too few rounds"
    empty = steady_state([])
    assert empty.status == "too few rounds" and empty.rounds == [] and empty.window is None


def test_a_window_of_zeros_is_never_steady():
    result = steady_state([0.0] * 25)
    assert result.status == "not steady"
    assert result.rounds[-1].average == 0 and result.rounds[-1].excursion is None


# ---- consistency ---------------------------------------------------------------------------


def run_rows(per_second, slow_seconds=()):
    rows = []
    for second, n in enumerate(per_second):
        rows += ios(n, second, latency_ns=20 * MS if second in slow_seconds else 100_000)
    return chunk(rows)


def test_consistency_of_the_last_400_seconds():
    # 100 s of a fresh drive at 50 IOPS, then 400 s alternating 9 and 11: average 10, std 1.
    per_second = [50] * 100 + [9, 11] * 200
    bins = consistency_bins()
    bins.add(run_rows(per_second, slow_seconds={0, 499}))
    result = consistency(bins, duration_ns=500 * S)
    assert (result.seconds, result.short) == (400, False)
    assert result.average_iops == pytest.approx(10)
    assert result.stddev_iops == pytest.approx(1)
    assert result.consistency == pytest.approx(10)
    assert result.slow_share == pytest.approx(11 / 4000)  # second 499 only
    assert result.slow_share_run == pytest.approx((50 + 11) / (5000 + 4000))


def test_consistency_of_a_short_a_flat_and_an_empty_run():
    bins = consistency_bins()
    bins.add(run_rows([20] * 30))
    short = consistency(bins)
    assert (short.seconds, short.short, short.average_iops) == (30, True, 20)
    assert short.consistency == math.inf and short.slow_share == 0
    empty = consistency(consistency_bins())
    assert empty.seconds == 0 and empty.average_iops is None and empty.consistency is None
    assert empty.slow_share is None and empty.slow_share_run is None
    idle = consistency(consistency_bins(), duration_ns=10 * S)  # a run that did nothing
    assert idle.average_iops == 0 and idle.consistency is None and idle.slow_share is None


def test_consistency_needs_its_threshold():
    with pytest.raises(ValueError, match="threshold"):
        consistency(Bins(S, (MS,)))


# ---- ACT ------------------------------------------------------------------------------------


def act_rows(seconds, per_second, over_1ms=0, over_8ms=0, over_64ms=0):
    """Per second: `per_second` transactions, of which the first few are late by 2, 10 or
    100 ms (counted from the intended time: issued late, served fast)."""
    rows = []
    for second in range(seconds):
        lates = [100 * MS] * over_64ms + [10 * MS] * over_8ms + [2 * MS] * over_1ms
        lates += [0] * (per_second - len(lates))
        for i, late in enumerate(lates):
            t = second * S + i * 1000
            rows.append((R, 1536, t, t + late, t + late + 50_000, 1536))
    return chunk(rows)


def act_of(rows, **kw):
    bins = act_bins(transaction_max_length=65536)
    bins.add(rows)
    return act_check(bins, **kw)


@pytest.mark.parametrize("over,passed", [
    (dict(over_1ms=49), True),  # 4.9 % over 1 ms
    (dict(over_1ms=50), False),  # 5.0 %: the limit is strict
    (dict(over_8ms=9, over_1ms=40), True),  # 4.9 % over 1 ms, 0.9 % over 8 ms
    (dict(over_8ms=10), False),  # 1.0 % over 8 ms
    (dict(over_64ms=1), False),  # 0.1 % over 64 ms
])
def test_act_limits_per_period(over, passed):
    # 10-second periods of 100 transactions a second: 1,000 per period; the limits bite
    # on each period, so a fault in every second is a fault in every period.
    rows = act_rows(20, 100)
    faulty = act_rows(1, 100, **over)
    for name in COLUMNS:  # second 13 of period 2 gets the faults
        rows[name][1300:1400] = faulty[name] + (13 * S if name.endswith("_ns") else 0)
    result = act_of(rows, period_s=10, duration_ns=20 * S)
    assert result.passed is passed
    assert [p.passed for p in result.periods] == [True, passed]
    assert not any(p.partial for p in result.periods)
    if not passed:
        assert result.reason.startswith("period 2:")


def test_act_partial_period_is_reported_not_scored():
    rows = act_rows(25, 100, over_64ms=50)  # every second far too slow
    ok_rows = act_rows(20, 100)
    for name in COLUMNS:
        rows[name][:2000] = ok_rows[name]
    result = act_of(rows, period_s=10, duration_ns=25 * S)
    assert result.passed
    assert [(p.partial, p.passed, p.seconds) for p in result.periods] == [
        (False, True, 10), (False, True, 10), (True, False, 5)]


def test_act_fails_without_a_whole_period_or_with_failed_or_missing_transactions():
    short = act_of(act_rows(5, 100), period_s=10, duration_ns=5 * S)
    assert not short.passed and short.reason == "no whole period ran"
    # Interrupted after 12 s of a 20 s run: the second period has 2 s of transactions.
    interrupted = act_of(act_rows(12, 100), period_s=10, duration_ns=20 * S)
    assert interrupted.passed  # 200 transactions, all fast
    stopped = act_of(act_rows(9, 100), period_s=3, duration_ns=15 * S)
    assert not stopped.passed and stopped.reason == "period 4: no transactions"
    failed = act_rows(10, 100)
    failed["result"][5] = -5
    result = act_of(failed, period_s=10)
    assert not result.passed and result.reason == "period 1: 1 failed transactions"


def test_act_uses_intended_time_not_issue_time():
    # Issued 2 ms late, served in 50 us: a device-latency score would pass it.
    rows = act_rows(10, 100, over_1ms=100)
    result = act_of(rows, period_s=10)
    assert not result.passed and result.periods[0].shares[0] == 1.0


@settings(max_examples=60, deadline=None)
@given(threshold=st.integers(0, 200), start=st.integers(1, 160), step=st.integers(1, 30),
       resolution=st.integers(1, 5))
def test_act_search_finds_the_highest_passing_multiple(threshold, start, step, resolution):
    runs = []

    def run(multiple):
        runs.append(multiple)
        return multiple <= threshold

    result = act_search(run, start=start, step=step, resolution=resolution)
    assert runs[0] == start and result.tried == [(m, m <= threshold) for m in runs]
    if threshold >= start:
        assert (result.score, result.at_start, len(runs)) == (start, True, 1)
    elif threshold < 1:
        assert result.score == 0 and runs[-1] == 1
    else:
        assert result.score <= threshold < result.score + resolution
        assert not result.at_start and (result.score, True) in result.tried
    assert len(set(runs)) == len(runs)  # never the same multiple twice


def test_act_search_steps_down_from_150_like_the_review():
    result = act_search(lambda m: m <= 42)
    assert [m for m, _ in result.tried][:12] == list(range(150, 30, -10))
    assert result.score == 42


def test_act_device_latency_ignores_the_wait_before_issue():
    # The same rows as above scored as ACT 6 does (device latency, 50 us): they pass.
    bins = act_bins(transaction_max_length=65536, latency_from="issue")
    bins.add(act_rows(10, 100, over_1ms=100))
    assert act_check(bins, period_s=10).passed
    assert set(ACT_LATENCY) == {"intended", "issue"} and "due" in ACT_LATENCY["intended"]


def test_lateness_bins_count_issue_minus_intended_only():
    rows = ios(10, 0, latency_ns=50 * MS, late_ns=0) + ios(10, 1, latency_ns=10_000, late_ns=2 * MS)
    bins = Bins(S, (1 * MS,), latency_from="lateness", by="intended")
    bins.add(chunk(rows))
    # Slow but on time: not late. Fast but issued 2 ms late: late.
    assert bins.over[0].tolist() == [0, 10] and bins.counts.tolist() == [10, 10]


@pytest.mark.parametrize("late_ns,length,gives_up", [
    (400 * MS, 1536, False),  # 250,000 I/Os/s x 0.4 s = 100,000 queued: at the bound
    (401 * MS, 1536, True),  # past it
    (10 * S, 128 * 1024, False),  # large-block I/O exactly 10 s late
    (10 * S + 1, 128 * 1024, True),
])
def test_act_gives_up_when_queues_or_large_block_lag_pass_acts_bounds(late_ns, length, gives_up):
    watch = ActWatch(rate=250_000, transaction_max_length=65536)
    rows = chunk(ios(5, 0, op=R, length=1536) + ios(1, 1, op=R, length=length, late_ns=late_ns))
    if gives_up:
        with pytest.raises(ActGaveUp, match="ACT"):
            watch.add(rows)
    else:
        watch.add(rows)
