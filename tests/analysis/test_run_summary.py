"""RunSummary on hand-made result chunks with known answers, and its fio-shaped JSON."""
import errno
import json
import math
from pathlib import Path

import numpy as np
import pytest

from analysis.histogram import LatencyHistogram
from analysis.summary import RunSummary
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

FIO_JSON = Path(__file__).parents[1] / "data" / "fio-3.33-randrw-psync.json"
COLUMNS = ("op", "length", *RESULT_COLUMNS)
R, W, D, F = Op.READ, Op.WRITE, Op.DISCARD, Op.FLUSH
T0 = 5_000_000  # the run's first intended time; the duration must not depend on it


def chunk(rows):
    """Rows of (op, length, intended_ns, issue_ns, complete_ns, result) -> a result chunk."""
    cols = list(zip(*rows)) if rows else [()] * len(COLUMNS)
    dtypes = {**TRACE_COLUMNS, **RESULT_COLUMNS}
    return {name: np.array(c, dtype=dtypes[name]) for name, c in zip(COLUMNS, cols)}


# (op, length, intended, issue, complete, result)
KNOWN = [
    (R, 4096, T0 + 0, T0 + 10, T0 + 110, 4096),  # dev 100, late 10, workload 110
    (R, 4096, T0 + 100, T0 + 90, T0 + 200, 4096),  # issued early: late 0, workload 110
    (W, 8192, T0 + 200, T0 + 250, T0 + 1000, 4096),  # short write: dev 750, late 50
    (W, 4096, T0 + 300, T0 + 300, T0 + 500, -errno.EIO),  # dev 200
    (D, 1 << 20, T0 + 400, T0 + 400, T0 + 600, 1 << 20),
    (D, 1 << 20, T0 + 450, T0 + 450, T0 + 650, 0),  # discards are never short
    (F, 0, T0 + 500, T0 + 510, T0 + 2000, 0),  # the last completion: duration 2000 ns
    (R, 4096, T0 + 600, -1, T0 + 10**12, -errno.EIO),  # never issued: ignored entirely
    (W, 4096, T0 + 700, T0 + 800, T0 + 900, -errno.ENOSPC),  # dev 100, late 100
]


def summary_of(*chunks):
    s = RunSummary(jobname="known")
    for c in chunks:
        s.add(c)
    return s


def test_counts_bytes_errors_and_short_transfers():
    s = summary_of(chunk(KNOWN))
    r, w, d, f = (s.ops[k] for k in (R, W, D, F))
    assert (r.ios, r.bytes, r.errors, r.short_ios, r.early_ios, r.not_issued) == (2, 8192, 0, 0, 1, 1)
    assert (w.ios, w.bytes, w.errors, w.short_ios, w.early_ios) == (3, 4096, 2, 1, 0)
    assert w.errno_counts == {errno.EIO: 1, errno.ENOSPC: 1}
    assert (d.ios, d.bytes, d.short_ios) == (2, 1 << 20, 0)
    assert (f.ios, f.bytes, f.errors) == (1, 0, 0)
    total = s.total()
    assert (total.ios, total.errors, total.not_issued, total.early_ios) == (8, 2, 1, 1)


def test_rates_over_run_duration():
    s = summary_of(chunk(KNOWN))
    assert s.duration_ns == 2000
    assert s.iops(R) == pytest.approx(2 / 2e-6)
    assert s.iops(W) == pytest.approx(1 / 2e-6)  # 3 writes, 2 of them failed: not counted
    assert s.iops() == pytest.approx(6 / 2e-6)
    assert s.mb_per_s(R) == pytest.approx(8192 / 1e6 / 2e-6)
    assert s.mib_per_s(D) == pytest.approx(1.0 / 2e-6)


def test_latencies_and_lateness_clipping():
    s = summary_of(chunk(KNOWN))
    r, w = s.ops[R], s.ops[W]
    assert (r.device.min, r.device.max, r.device.mean) == (100, 110, 105.0)
    assert (r.lateness.min, r.lateness.max) == (0, 10)  # the early read counts as 0, not -10
    assert (r.workload.min, r.workload.max) == (110, 110)
    assert sorted([w.device.min, w.device.max]) == [100, 750]
    assert w.device.percentile(50) == 200
    assert (w.lateness.min, w.lateness.percentile(50), w.lateness.max) == (0, 50, 100)
    assert w.workload.max == 800
    assert s.ops[F].device.max == 1490


def test_rows_never_issued_are_ignored():
    only_unissued = chunk([(R, 4096, 0, -1, 10**9, -errno.EIO), (W, 512, 5, -1, -1, 0)])
    s = summary_of(only_unissued)
    assert s.duration_ns == 0 and s.iops() == 0.0
    assert s.total().ios == 0 and s.total().errors == 0
    assert (s.ops[R].not_issued, s.ops[W].not_issued) == (1, 1)
    assert s.ops[R].device.count == 0


def approx_equal(a, b, path=""):
    """Nested equality, floats to 1e-9 relative."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            approx_equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            approx_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (path, a, b)
    else:
        assert a == b, (path, a, b)


def random_rows(n, seed):
    rng = np.random.default_rng(seed)
    op = rng.integers(0, 4, n)
    length = np.where(op == F, 0, 4096 * rng.integers(1, 64, n))
    intended = np.sort(rng.integers(0, 10**9, n))
    issue = np.where(rng.random(n) < 0.05, -1, intended + rng.integers(-1000, 10**6, n))
    complete = issue + rng.lognormal(11, 1.5, n).astype(np.int64)
    result = np.where(rng.random(n) < 0.03, -rng.choice([5, 28, 11], n), length)
    result = np.where(rng.random(n) < 0.02, length // 2, result)
    return chunk(list(zip(op, length, intended, issue, complete, result)))


def split(c, cuts):
    return [{k: v[a:b] for k, v in c.items()} for a, b in zip([0, *cuts], [*cuts, None])]


def test_chunked_add_equals_single_add():
    whole = random_rows(5000, seed=3)
    at_once = summary_of(whole)
    in_chunks = summary_of(*split(whole, [1, 700, 701, 2500, 4999]))
    approx_equal(in_chunks.to_dict(), at_once.to_dict())
    assert in_chunks.format_table() == at_once.format_table()
    assert at_once.total().errors > 0 and at_once.total().not_issued > 0  # the data exercises both


def test_random_chunk_matches_numpy_reference():
    # The Numba scan and scatter against plain NumPy masks, op by op.
    c = random_rows(4000, seed=6)
    s = summary_of(c)
    issued = c["issue_ns"] >= 0
    start = np.minimum(c["intended_ns"], c["issue_ns"])[issued].min()
    assert s.duration_ns == c["complete_ns"][issued].max() - start
    for k in Op:
        m = issued & (c["op"] == k)
        res, length = c["result"][m], c["length"][m]
        st = s.ops[k]
        assert st.not_issued == np.count_nonzero(~issued & (c["op"] == k))
        assert (st.ios, st.bytes, st.errors) == (m.sum(), res[res > 0].sum(), (res < 0).sum())
        codes, times = np.unique(-res[res < 0], return_counts=True)
        assert st.errno_counts == dict(zip(codes.tolist(), times.tolist()))
        exp_short = ((res >= 0) & (res < length)).sum() if k in (R, W) else 0
        assert st.short_ios == exp_short
        late = c["issue_ns"][m] - c["intended_ns"][m]
        assert st.early_ios == (late < 0).sum()
        expected = {
            "device": c["complete_ns"][m] - c["issue_ns"][m],
            "lateness": np.maximum(late, 0),
            "workload": c["complete_ns"][m] - np.minimum(c["intended_ns"][m], c["issue_ns"][m]),
        }
        for name, values in expected.items():
            h = getattr(st, name)
            ref = LatencyHistogram()
            ref.add(values)
            np.testing.assert_array_equal(h.counts, ref.counts, err_msg=f"{k.name} {name}")
            assert (h.min, h.max) == (values.min(), values.max())
    errors = c["result"] < 0
    first = np.flatnonzero(issued & errors)
    first = first[np.argmin(c["complete_ns"][first])]
    assert s.first_error == -c["result"][first]


def test_op_column_of_another_integer_dtype():
    c = chunk(KNOWN)
    s = summary_of(c)
    c["op"] = c["op"].astype(np.int64)
    approx_equal(summary_of(c).to_dict(), s.to_dict())
    c["op"][3] = -1
    with pytest.raises(ValueError, match="unknown op code -1 at row 3"):
        RunSummary().add(c)


def test_merge_equals_add_of_both():
    a, b = random_rows(1500, seed=4), random_rows(1500, seed=5)
    merged = summary_of(a)
    merged.merge(summary_of(b))
    approx_equal(merged.to_dict(), summary_of(a, b).to_dict())


def leaf_types(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(leaf_types(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = type(v)
    return out


def test_json_keys_and_types_match_fio():
    fio_job = json.loads(FIO_JSON.read_text())["jobs"][0]
    ours = summary_of(chunk(KNOWN)).to_dict()
    job = ours["jobs"][0]
    assert job["jobname"] == "known"
    shared_job = {"jobname", "groupid", "error", "read", "write", "trim", "sync", "job_runtime"}
    assert shared_job <= fio_job.keys() and shared_job <= job.keys()
    shared_op = {
        "io_bytes", "io_kbytes", "bw_bytes", "bw", "iops", "runtime", "total_ios", "short_ios",
        "drop_ios", "clat_ns", "lat_ns",
    }
    lat_keys = {"min", "max", "mean", "stddev", "N", "percentile"}
    for section in ("read", "write"):
        assert shared_op <= fio_job[section].keys() and shared_op <= job[section].keys()
        assert lat_keys <= fio_job[section]["clat_ns"].keys()
        for lat in ("clat_ns", "lat_ns", "lateness_ns"):
            assert lat_keys == job[section][lat].keys()
            assert job[section][lat]["percentile"].keys() <= fio_job[section]["clat_ns"]["percentile"].keys()
        # Every leaf we share with fio has fio's JSON type (int stays int, iops is a float).
        fio_types = leaf_types(fio_job[section])
        our_types = leaf_types(job[section])
        for key in fio_types.keys() & our_types.keys():
            assert our_types[key] is fio_types[key], key
        # 9 scalars, clat_ns's 5 stats and 8 percentiles, lat_ns's 5 (fio's has no percentiles).
        assert len(fio_types.keys() & our_types.keys()) == 9 + 5 + 8 + 5
    assert {"total_ios", "lat_ns"} <= job["sync"].keys()
    assert list(job["read"]["clat_ns"]["percentile"]) == [
        "1.000000", "5.000000", "10.000000", "50.000000", "90.000000", "99.000000",
        "99.900000", "99.990000",
    ]
    json.dumps(ours)  # no NumPy scalars anywhere


def test_json_values():
    d = summary_of(chunk(KNOWN)).to_dict()
    job, tr = d["jobs"][0], d["tracereplay"]
    read = job["read"]
    assert (read["io_bytes"], read["io_kbytes"], read["total_ios"], read["drop_ios"]) == (8192, 8, 2, 1)
    assert read["bw_bytes"] == 8192 * 10**9 // 2000 and read["bw"] == read["bw_bytes"] // 1024
    assert read["iops"] == pytest.approx(1e6)
    assert read["clat_ns"]["N"] == 2 and read["clat_ns"]["percentile"]["50.000000"] == 100
    assert read["lat_ns"]["max"] == 110 and read["lateness_ns"]["max"] == 10
    assert (job["write"]["short_ios"], job["write"]["errors"]) == (1, 2)
    assert job["trim"]["total_ios"] == 2 and job["sync"]["total_ios"] == 1
    assert job["error"] == errno.EIO  # the first failure to complete (t=500 before t=900)
    assert tr["duration_ns"] == 2000 and tr["total_ios"] == 8 and tr["early_ios"] == 1
    assert tr["errors_by_errno"] == {"EIO": 1, "ENOSPC": 1}
    assert tr["ops"]["discard"]["mib_per_s"] == pytest.approx(1.0 / 2e-6)


def test_empty_op_sections_look_like_fio():
    d = summary_of(chunk([(R, 4096, 0, 0, 1000, 4096)])).to_dict()["jobs"][0]
    assert d["write"]["clat_ns"] == {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}
    assert d["write"]["total_ios"] == 0 and d["write"]["runtime"] == 0 and d["error"] == 0


def test_format_table():
    s = summary_of(chunk(KNOWN + [(R, 4096, T0, T0, T0 + 1_500_000, 4096)]))
    lines = s.format_table().splitlines()
    names = [line.split()[0] for line in lines[2:]]
    assert names[:5] == ["read", "write", "discard", "flush", "all"]
    read = lines[2].split()
    assert read[1] == "3" and "1.50ms" in read  # the slow read is the read max
    assert lines[-1] == "errors 2 (EIO 1, ENOSPC 1), short transfers 1, not issued 1"
    only_reads = summary_of(chunk([(R, 4096, 0, 0, 850, 4096)])).format_table().splitlines()
    assert [line.split()[0] for line in only_reads[2:]] == ["read"]  # no error line, no total
    assert "850ns" in only_reads[2].split()


def test_bad_chunks_raise_and_change_nothing():
    s = summary_of(chunk(KNOWN))
    before = s.to_dict()
    with pytest.raises(ValueError, match="unknown op code 7"):
        s.add(chunk([(7, 0, 0, 0, 1, 0)]))
    with pytest.raises(ValueError, match="completed before it was issued"):
        s.add(chunk([(R, 4096, 0, 0, 10, 4096), (W, 4096, 0, 100, 50, 4096)]))
    bad = chunk(KNOWN)
    del bad["complete_ns"]
    with pytest.raises(ValueError, match="complete_ns"):
        s.add(bad)
    approx_equal(s.to_dict(), before)


def test_format_table_keeps_columns_apart_at_large_values():
    """53 GiB-sized I/Os completing in 1 ns: 5e10 IOPS, 5e13 MB/s, each still its own column."""
    s = summary_of(chunk([(R, 1 << 30, T0, T0, T0 + 1, 1 << 30)] * 50 + [(W, 1 << 30, T0, T0, T0 + 1, 1 << 30)] * 3))
    lines = s.format_table().splitlines()
    for line, k in zip(lines[2:], (R, W, None)):
        cells = line.split()
        assert len(cells) == 14, line  # op, I/Os, IOPS, MB/s, |, five device, |, three late
        assert cells[2] == f"{s.iops(k):.0f}" and cells[3] == f"{s.mb_per_s(k):.0f}", line
