"""The synthetic generators: schema, requested statistics within binomial/Poisson bounds,
reproducibility, chunk-size independence, preconditioning and ACT shapes, fitting, and the
Numba kernels against plain references."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.runner import RunOptions, replay
from synth import generators as g
from synth.generators import (
    BLOCK_ROWS, GeneratorError, act_load, fit_trace, precondition, random_mix,
    sequential_fill, sequential_mix, snia_purge_fill, to_trace,
)
from traces.errors import ReplayError, TraceFormatError
from traces.schema import TRACE_COLUMNS, Op
from traces.trace import open_trace, read_trace, write_trace

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FAST = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def collect(generator, rows=1 << 16):
    parts = list(generator.chunks(rows))
    if not parts:
        return {k: np.empty(0, v) for k, v in TRACE_COLUMNS.items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def binomial_ok(hits, n, p, sigmas=5):
    """|hits/n - p| within `sigmas` standard deviations (plus one count of slack)."""
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


def poisson_ok(count, mean, sigmas=5):
    return abs(count - mean) <= sigmas * math.sqrt(mean) + 1


size_mixes = st.one_of(
    st.sampled_from([512, 4096, 8192, 128 * KIB]),
    st.dictionaries(st.sampled_from([4096, 8192, 16384, 65536]),
                    st.floats(0.05, 1.0), min_size=1, max_size=3),
)
distributions = st.one_of(
    st.just("uniform"),
    st.floats(0.2, 2.0).map(lambda s: f"zipf:{s:.2f}"),
    st.tuples(st.integers(0, 100), st.integers(1, 100)).map(lambda t: f"hotcold:{t[0]}/{t[1]}"),
)


@st.composite
def random_mixes(draw):
    sizes = draw(size_mixes)
    biggest = max(sizes) if isinstance(sizes, dict) else sizes
    align = draw(st.sampled_from([512, 4096]))
    span = draw(st.integers(biggest // align + 1, 1 << 22)) * align
    open_loop = draw(st.booleans())
    return dict(
        block_size=sizes, read_share=draw(st.floats(0, 1)), span=span,
        span_start=draw(st.integers(0, 1000)) * align, align=align,
        distribution=draw(distributions), sequential_share=draw(st.sampled_from([0.0, 0.3, 1.0])),
        rate=draw(st.floats(100, 1e6)) if open_loop else None,
        arrival=draw(st.sampled_from(["constant", "poisson"])),
        count=draw(st.integers(0, 3000)), seed=draw(st.integers(0, 2**63)),
    )


@FAST
@given(random_mixes())
def test_random_mix_rows_satisfy_schema_and_request(tmp_path, params):
    gen = random_mix(**params)
    cols = collect(gen, rows=777)
    n = params["count"]
    assert len(cols["ts_ns"]) == n
    for name, dtype in TRACE_COLUMNS.items():
        assert cols[name].dtype == dtype
    path = write_trace(tmp_path / "t.parquet", cols, {"name": "x"})  # the reader's rules
    back, _ = read_trace(path)
    for name in TRACE_COLUMNS:
        np.testing.assert_array_equal(back[name], cols[name])
    sizes = set(params["block_size"]) if isinstance(params["block_size"], dict) else {params["block_size"]}
    assert set(cols["length"].tolist()) <= sizes
    assert set(cols["op"].tolist()) <= {Op.READ, Op.WRITE}
    assert (cols["offset"] % params["align"] == 0).all()
    assert (cols["offset"] >= params["span_start"]).all()
    assert (cols["offset"] + cols["length"] <= params["span_start"] + params["span"]).all()
    if params["rate"] is None:
        assert (cols["ts_ns"] == 0).all()
    else:
        assert (np.diff(cols["ts_ns"]) >= 0).all()
    assert binomial_ok(int((cols["op"] == Op.READ).sum()), n, params["read_share"])


@pytest.mark.parametrize("share", [0.0, 0.2, 0.7, 1.0])
def test_read_share_and_size_mix_within_bounds(share):
    mix = {4096: 0.6, 65536: 0.3, 131072: 0.1}
    n = 200_000
    cols = collect(random_mix(block_size=mix, read_share=share, count=n, seed=5))
    assert binomial_ok(int((cols["op"] == Op.READ).sum()), n, share)
    for size, p in mix.items():
        assert binomial_ok(int((cols["length"] == size).sum()), n, p)


def test_uniform_offsets_cover_the_span_evenly():
    n, span = 200_000, 1 << 30
    cols = collect(random_mix(span=span, count=n, seed=2))
    tenths = np.bincount(cols["offset"] * 10 // span, minlength=10)
    assert all(binomial_ok(int(c), n, 0.1) for c in tenths)


@pytest.mark.parametrize("s", [0.6, 1.0, 1.4])
def test_zipf_matches_its_bounded_power_law(s):
    """P(slot < k) = ((k+1)^(1-s) - 1) / ((N+1)^(1-s) - 1) (log ratio at s = 1)."""
    n, span = 200_000, 1 << 30
    gen = random_mix(span=span, count=n, distribution=f"zipf:{s}", seed=3)
    slots = collect(gen)["offset"] // 4096
    total = gen.n_slots
    for k in (1, 10, 1000, total // 2):
        if s == 1.0:
            p = math.log(k + 1) / math.log(total + 1)
        else:
            p = ((k + 1) ** (1 - s) - 1) / ((total + 1) ** (1 - s) - 1)
        assert binomial_ok(int((slots < k).sum()), n, p)


def test_hotcold_puts_x_percent_on_y_percent():
    n, span = 100_000, 1 << 30
    cols = collect(random_mix(span=span, count=n, distribution="hotcold:90/10", seed=4))
    hot = cols["offset"] < span // 10
    assert binomial_ok(int(hot.sum()), n, 0.9)
    # Within each region, uniform: the hot tenth's two halves get equal shares.
    first_half = cols["offset"][hot] < span // 20
    assert binomial_ok(int(first_half.sum()), int(hot.sum()), 0.5)


@pytest.mark.parametrize("rate,duration", [(1000.0, 20.0), (250_000.0, 1.0)])
def test_poisson_and_constant_rates(rate, duration):
    poisson = collect(random_mix(rate=rate, duration_s=duration, seed=6))
    assert poisson_ok(len(poisson["ts_ns"]), rate * duration)
    assert poisson["ts_ns"][-1] < duration * 1e9
    gaps = np.diff(poisson["ts_ns"]) / 1e9
    # Exponential gaps: mean 1/rate, coefficient of variation 1.
    assert abs(gaps.mean() * rate - 1) < 5 / math.sqrt(len(gaps))
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05
    constant = collect(random_mix(rate=rate, duration_s=duration, arrival="constant", seed=6))
    assert len(constant["ts_ns"]) == math.ceil(rate * duration)
    np.testing.assert_array_equal(
        constant["ts_ns"], (np.arange(len(constant["ts_ns"])) * (1e9 / rate)).astype(np.int64))


def test_count_limits_an_open_loop_run_before_its_duration():
    cols = collect(random_mix(rate=1000, duration_s=100, count=500, seed=1))
    assert len(cols["ts_ns"]) == 500


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**63), rows=st.integers(1, 3 * BLOCK_ROWS),
       kind=st.sampled_from(["random", "sequential", "act", "fit-like"]))
def test_same_seed_same_trace_whatever_the_chunk_size(seed, rows, kind):
    count = BLOCK_ROWS * 2 + 123
    make = {
        "random": lambda: random_mix(count=count, rate=1e5, seed=seed, distribution="zipf:0.9"),
        "sequential": lambda: sequential_mix(count=count, streams=3, block_size={4096: 1, 65536: 1},
                                             span=GIB, seed=seed),
        "act": lambda: act_load(multiple=20, span=GIB, duration_s=3.5, seed=seed),
        "fit-like": lambda: random_mix(count=count, sequential_share=0.5, seed=seed,
                                       block_size={4096: 1, 12288: 1}),
    }[kind]
    a, b = collect(make(), rows=rows), collect(make(), rows=BLOCK_ROWS)
    for name in TRACE_COLUMNS:
        np.testing.assert_array_equal(a[name], b[name])
    sizes = [len(c["ts_ns"]) for c in make().chunks(rows)]
    assert all(s == rows for s in sizes[:-1]) and 0 < sizes[-1] <= rows


def test_different_seeds_differ():
    a = collect(random_mix(count=1000, seed=1))
    b = collect(random_mix(count=1000, seed=2))
    assert not np.array_equal(a["offset"], b["offset"])


def test_an_hour_at_500k_iops_is_never_materialised():
    gen = random_mix(count=3600 * 500_000, queue_depth=32, seed=1)
    first = next(gen.chunks(1000))
    assert len(first["ts_ns"]) == 1000 and (first["ts_ns"] == 0).all()
    assert gen.parameters()["queue_depth"] == 32


def test_sequential_streams_each_run_through_their_region():
    span, streams, n = 48 * MIB, 3, 30_000
    cols = collect(sequential_mix(block_size=64 * KIB, read_share=0.5, span=span, streams=streams,
                                  count=n, seed=1))
    region = span // streams
    for s in range(streams):
        off = cols["offset"][s::streams]
        expected = s * region + (np.arange(len(off)) * 64 * KIB) % region
        np.testing.assert_array_equal(off, expected)
    assert binomial_ok(int((cols["op"] == Op.READ).sum()), n, 0.5)


def test_fill_writes_the_span_exactly_n_times_with_a_short_last_write():
    span = 10 * MIB + 8 * KIB  # not a multiple of 128 KiB
    cols = collect(sequential_fill(span=span, passes=3), rows=7)
    assert (cols["op"] == Op.WRITE).all() and (cols["ts_ns"] == 0).all()
    per_pass = math.ceil(span / (128 * KIB))
    assert len(cols["offset"]) == 3 * per_pass
    for p in range(3):
        off = cols["offset"][p * per_pass:(p + 1) * per_pass]
        length = cols["length"][p * per_pass:(p + 1) * per_pass]
        np.testing.assert_array_equal(off, np.concatenate([[0], np.cumsum(length)[:-1]]))
        assert length.sum() == span and length[-1] == 8 * KIB


def test_precondition_fills_then_writes_random_4k():
    span = 8 * MIB
    cols = collect(precondition(span=span, passes=2, random_writes=5000, seed=3))
    fill = 2 * span // (128 * KIB)
    assert (cols["length"][:fill] == 128 * KIB).all()
    assert (cols["length"][fill:] == 4096).all() and len(cols["length"]) == fill + 5000
    assert (cols["op"] == Op.WRITE).all()
    random_part = cols["offset"][fill:]
    assert len(np.unique(random_part)) > 1000 and (random_part % 4096 == 0).all()


def test_snia_purge_then_twice_the_capacity():
    span = 4 * MIB
    gen = snia_purge_fill(span=span, span_start=MIB)
    cols = collect(gen)
    assert (cols["op"][0], cols["offset"][0], cols["length"][0]) == (Op.DISCARD, MIB, span)
    assert (cols["op"][1:] == Op.WRITE).all() and cols["length"][1:].sum() == 2 * span
    assert gen.span_end == 5 * MIB


@pytest.mark.parametrize("multiple,device_block,read_length", [(10, 512, 1536), (4, 4096, 4096)])
def test_act_load_rates_and_shapes(multiple, device_block, read_length):
    duration = 20.0
    gen = act_load(multiple=multiple, span=GIB, duration_s=duration, device_block=device_block,
                   seed=7)
    cols = collect(gen)
    small = cols["length"] == read_length
    large = cols["length"] == 128 * KIB
    assert (small | large).all() and (cols["op"][small] == Op.READ).all()
    assert poisson_ok(int(small.sum()), 2000 * multiple * duration)
    # 1,000 X writes/s of 1,536 B records -> 128 KiB blocks, doubled by defragmentation.
    large_rate = 1000 * multiple * 1536 / (128 * KIB) * 2
    assert poisson_ok(int((large & (cols["op"] == Op.WRITE)).sum()), large_rate * duration)
    assert poisson_ok(int((large & (cols["op"] == Op.READ)).sum()), large_rate * duration)
    assert (cols["offset"][small] % device_block == 0).all()
    assert (cols["offset"][large] % (128 * KIB) == 0).all()
    assert (cols["offset"] + cols["length"] <= GIB).all()
    assert cols["ts_ns"][-1] < duration * 1e9 and read_length <= gen.transaction_max_length


def test_to_trace_writes_metadata_and_the_same_rows(tmp_path):
    gen = random_mix(count=BLOCK_ROWS + 10, rate=5000, seed=9, distribution="hotcold:80/20")
    path = to_trace(gen, tmp_path / "s.parquet", {"name": "mine"})
    cols, meta = read_trace(path)
    expected = collect(gen)
    for name in TRACE_COLUMNS:
        np.testing.assert_array_equal(cols[name], expected[name])
    assert meta["name"] == "mine" and meta["device_size"] == 8 * GIB
    assert meta["source"]["kind"] == "synth:random"
    assert meta["source"]["parameters"]["distribution"] == "hotcold:80/20"
    assert meta["source"]["parameters"]["seed"] == 9
    assert "SYNTHETIC" in meta["description"]


def test_to_trace_leaves_nothing_when_generation_fails(tmp_path):
    class Failing(g.RandomMix):
        def _blocks(self):
            yield from super()._blocks()
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        to_trace(Failing(count=100), tmp_path / "f.parquet")
    assert list(tmp_path.iterdir()) == []


def test_fit_recovers_a_known_mix_and_its_own_fit(tmp_path):
    mix = {4096: 0.5, 65536: 0.5}
    known = random_mix(block_size=mix, read_share=0.3, span=GIB, sequential_share=0.6,
                       rate=20_000, duration_s=5, seed=11)
    path = to_trace(known, tmp_path / "known.parquet")
    fitted, figures = fit_trace(path, seed=12)
    n = figures["ios"]
    assert poisson_ok(n, 100_000)
    assert binomial_ok(round(figures["read_share"] * n), n, 0.3)
    # A continuation is dropped when it would run past the span: a tiny effect on 1 GiB.
    assert binomial_ok(round(figures["sequential_share"] * n), n, 0.6)
    assert set(figures["size_mix"]) == {"4096", "65536"}
    assert binomial_ok(round(figures["size_mix"]["4096"] * n), n, 0.5)
    assert abs(figures["rate"] / 20_000 - 1) < 0.03
    assert figures["align"] == 4096 and figures["span"] <= GIB
    # The fitted generator, fitted again, gives the same figures within the same bounds.
    again = to_trace(fitted, tmp_path / "fitted.parquet")
    _, refit = fit_trace(again)
    assert refit["ios"] == n
    for key in ("read_share", "sequential_share"):
        assert binomial_ok(round(refit[key] * n), n, figures[key])
    assert abs(refit["rate"] / figures["rate"] - 1) < 0.03
    assert open_trace(again).metadata["source"]["fitted_from"]["ios"] == n


def test_fit_of_the_bundled_demo_trace():
    _, figures = fit_trace("traces/demo.parquet")
    assert figures["others"] > 0  # its flushes are counted, not modelled
    assert 0.4 < figures["read_share"] < 0.6 and "8192" in figures["size_mix"]
    assert 0 < figures["sequential_share"] < 0.4 and 1000 < figures["rate"] < 2500


def test_fit_refuses_garbage_and_traces_without_reads_or_writes(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 not really")
    with pytest.raises(TraceFormatError, match="junk.parquet"):
        fit_trace(junk)
    flushes = write_trace(tmp_path / "f.parquet", {"ts_ns": [0, 5], "op": [Op.FLUSH] * 2,
                                                  "offset": [0, 0], "length": [0, 0]}, {})
    with pytest.raises(GeneratorError, match="no reads or writes"):
        fit_trace(flushes)


@pytest.mark.parametrize("arrival", ["even", "poisson"])
def test_act_load_even_pacing_is_three_even_schedules(arrival):
    """ACT paces each stream evenly: small reads exactly 1 / (2,000 X) s apart, large-block
    writes and reads each on their own even schedule; Poisson gaps are anything but."""
    multiple, duration = 3, 30.0
    cols = collect(act_load(multiple=multiple, span=GIB, duration_s=duration, arrival=arrival))
    assert (np.diff(cols["ts_ns"]) >= 0).all() and cols["ts_ns"][-1] < duration * 1e9
    small = cols["length"] == 1536
    large_rate = 1000 * multiple * 1536 / (128 * KIB) * 2
    streams = [(small, 2000 * multiple), (~small & (cols["op"] == Op.WRITE), large_rate),
               (~small & (cols["op"] == Op.READ), large_rate)]
    for sel, rate in streams:
        gaps = np.diff(cols["ts_ns"][sel])
        if arrival == "even":
            assert abs(int(sel.sum()) - rate * duration) <= 1
            assert gaps.min() >= 1e9 / rate - 1 and gaps.max() <= 1e9 / rate + 1
        else:
            assert gaps.std() > 0.5 * gaps.mean()  # exponential gaps: stddev = mean
    with pytest.raises(GeneratorError, match="arrival must be 'even' or 'poisson'"):
        act_load(multiple=1, span=GIB, duration_s=1, arrival="bursty")


def test_an_unbounded_mix_has_no_count_and_never_ends():
    gen = random_mix(span=GIB, unbounded=True, read_share=0.5)
    assert gen.count is None and gen.parameters()["count"] is None
    rows = 0
    for c in gen.chunks(1 << 16):
        rows += len(c["op"])
        if rows >= 10 * BLOCK_ROWS:
            break
    assert rows == 10 * BLOCK_ROWS
    with pytest.raises(GeneratorError, match="unbounded mix is closed loop"):
        random_mix(span=GIB, unbounded=True, count=10)


@pytest.mark.parametrize("params,problem", [
    (dict(count=10, distribution="pareto"), "offset distribution"),
    (dict(count=10, read_share=1.5), "read share"),
    (dict(rate=100), "give count"),
    (dict(count=10, span=1024), "does not fit in the span"),
    (dict(count=10, block_size={}), "size mix is empty"),
    (dict(count=10, span_start=100), "not a multiple of the alignment"),
])
def test_bad_parameters_say_what_is_wrong(params, problem):
    with pytest.raises(GeneratorError, match=problem) as info:
        random_mix(**params)
    assert isinstance(info.value, ReplayError) and isinstance(info.value, ValueError)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.sampled_from([512, 1536, 4096]),
                          st.floats(0, 1)), max_size=60),
       st.floats(0, 1), st.integers(-1, 4000))
def test_continue_runs_matches_a_plain_loop(rows, p, prev_end):
    align, lo, hi = 512, 0, 600_000
    offset = np.array([r[0] * align for r in rows], dtype=np.int64)
    length = np.array([r[1] for r in rows], dtype=np.int64)
    draw = np.array([r[2] for r in rows], dtype=np.float64)
    expected, end = offset.copy(), prev_end
    for i in range(len(rows)):
        if draw[i] < p and end >= lo:
            start = -(-end // align) * align
            if start + length[i] <= hi:
                expected[i] = start
        end = expected[i] + length[i]
    got_end = g._continue_runs(offset, length, draw, p, prev_end, align, lo, hi)
    np.testing.assert_array_equal(offset, expected)
    assert got_end == end


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=80), st.integers(1, 4), st.integers(0, 10))
def test_stream_offsets_match_a_plain_loop(lengths, streams, first_row):
    region_size = 50
    length = np.array(lengths, dtype=np.int64)
    offset = np.empty(len(length), dtype=np.int64)
    position = np.zeros(streams, dtype=np.int64)
    region = np.arange(streams, dtype=np.int64) * 1000
    g._stream_offsets(first_row, length, offset, position, region, region_size)
    pos = [0] * streams
    for i, n in enumerate(lengths):
        s = (first_row + i) % streams
        n = min(n, region_size - pos[s])
        assert (offset[i], length[i]) == (region[s] + pos[s], n)
        pos[s] = (pos[s] + n) % region_size
    assert position.tolist() == pos


def test_a_generated_closed_loop_trace_replays_on_the_null_engine(tmp_path):
    from analysis.scoring import iops_series

    gen = random_mix(count=20_000, read_share=0.5, span=64 * MIB, seed=1)
    trace = to_trace(gen, tmp_path / "g.parquet")
    outcome = replay(trace, None, RunOptions(engine="null", timing="afap", qd=32),
                     output=tmp_path / "r.parquet")
    results = open_trace(outcome.output)
    series = iops_series(results.chunks())
    assert series.sum() == 20_000
