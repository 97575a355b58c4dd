"""The trace library in parallel on local cores: `replay import FILE... -o DIR` (each file its
own trace, with provenance), `replay traces ls/show` over a directory, the catalog and SQL over
it with DuckDB. Real processes, real files; Ray's side is in tests/replay/test_cluster.py."""
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis import catalog
from tests.cli_process import replay_cli
from traces.errors import ReplayError
from traces.schema import Op
from traces.trace import read_trace, write_trace

FILETIME_2007 = 128166372000000000


def msr_volumes(directory, count=3, rows=2000):
    """MSR Cambridge CSV files, one volume each, told apart by their sizes and read shares."""
    paths = []
    for v in range(count):
        path = directory / f"vol{v}.csv"
        path.write_text("".join(
            f"{FILETIME_2007 + 100 * i},hm,{v},{'Write' if i % (v + 2) == 0 else 'Read'},"
            f"{(i * 7919 % 3000) * 4096},{4096 * (v + 1)},{i}\n" for i in range(rows)))
        paths.append(path)
    return paths


def broken_volume(directory):
    path = directory / "broken.csv"
    path.write_text(f"{FILETIME_2007},hm,0,Read,0,4096,5\n{FILETIME_2007 + 1},hm,0,Read,0,abc,5\n")
    return path


def test_import_of_many_files_makes_one_trace_each_and_names_the_failing_one(tmp_path):
    good = msr_volumes(tmp_path)
    bad = broken_volume(tmp_path)
    out = tmp_path / "lib"
    out.mkdir()
    done = replay_cli("import", *good[:2], bad, good[2], "-o", out, "--jobs", "2", timeout=300)
    assert done.returncode == 1, done.stderr
    # One progress line per file; the bad one named with its error, the others all finished.
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 4
    assert any(f"{bad}: failed: {bad}: line 2: field 6 is 'abc'" in line for line in lines)
    assert sorted(p.name for p in out.glob("*.parquet")) == ["catalog.parquet", "vol0.parquet",
                                                             "vol1.parquet", "vol2.parquet"]
    assert "imported 3 of 4 files" in done.stdout
    for v, src in enumerate(good):
        cols, meta = read_trace(out / f"vol{v}.parquet")
        assert len(cols["ts_ns"]) == 2000 and set(cols["length"].tolist()) == {4096 * (v + 1)}
        assert meta["name"] == f"vol{v}" and meta["source"]["inputs"] == [src.name]
        assert meta["source"]["format"] == "msr" and meta["source"]["command"].startswith("replay import ")
    catalog = pq.read_table(out / "catalog.parquet").to_pylist()
    assert [r["name"] for r in catalog] == ["vol0", "vol1", "vol2"]
    assert [r["dominant_size"] for r in catalog] == [4096, 8192, 12288]


def test_parallel_import_gives_the_traces_of_sequential_import(tmp_path):
    from traces.convert import import_trace

    inputs = msr_volumes(tmp_path, count=4)
    parallel = tmp_path / "parallel"
    parallel.mkdir()
    done = replay_cli("import", *inputs, "-o", parallel, "-j", "2", timeout=300)
    assert done.returncode == 0, done.stderr
    for src in inputs:
        one, _ = import_trace([src], tmp_path / f"{src.stem}-seq.parquet")
        cols_seq, meta_seq = read_trace(one)
        cols_par, meta_par = read_trace(parallel / f"{src.stem}.parquet")
        assert cols_seq.keys() == cols_par.keys()
        for name in cols_seq:
            np.testing.assert_array_equal(cols_seq[name], cols_par[name])
        meta_seq["source"].pop("command"), meta_par["source"].pop("command")
        assert meta_seq == meta_par


def _trace(path, reads, writes, span_blocks, stride=4096):
    """A trace of `reads` then `writes` 4 KiB I/Os on `span_blocks` blocks `stride` apart."""
    n = reads + writes
    write_trace(path, {"ts_ns": np.arange(n, dtype=np.int64) * 1000,
                       "op": np.array([Op.READ] * reads + [Op.WRITE] * writes, np.uint8),
                       "offset": (np.arange(n, dtype=np.int64) % span_blocks) * stride,
                       "length": np.full(n, 4096, np.int64)},
                {"name": path.stem, "source": {"kind": "synth:test"}})


def test_catalog_and_sql_over_it_with_duckdb(tmp_path):
    import duckdb

    _trace(tmp_path / "readmostly.parquet", 90, 10, 100)  # read share 0.9, 400 KiB touched
    _trace(tmp_path / "writemostly.parquet", 10, 90, 100)
    _trace(tmp_path / "bigreads.parquet", 80, 20, 100, 200 << 20)  # 400 KiB touched over 19 GiB
    (tmp_path / "junk.parquet").write_text("not parquet")
    done = replay_cli("traces", "catalog", tmp_path, "-j", "2", timeout=300)
    assert done.returncode == 1
    assert "junk.parquet: failed:" in done.stderr and "cataloged 3 traces" in done.stdout
    catalog = tmp_path / "catalog.parquet"
    # DuckDB reads the file as it is.
    rows = duckdb.sql(f"SELECT name, read_share, footprint_bytes FROM '{catalog}' ORDER BY name").fetchall()
    assert rows == [("bigreads", 0.8, 100 * 4096), ("readmostly", 0.9, 100 * 4096),
                    ("writemostly", 0.1, 100 * 4096)]
    sql = ("SELECT name FROM catalog WHERE read_share > 0.7 AND footprint_bytes < 10 * 2^30 "
           "AND span_bytes < 10 * 2^30 ORDER BY name")
    done = replay_cli("traces", "query", sql, "--catalog", tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"name": "readmostly"}]
    done = replay_cli("traces", "query", "SELECT name, ios FROM catalog ORDER BY name", "-c", catalog)
    assert done.stdout.splitlines() == ["name         ios", "bigreads     100", "readmostly   100",
                                        "writemostly  100"]
    bad = replay_cli("traces", "query", "SELECT nothing FROM catalog", "-c", tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: the query failed: ")
    assert len(bad.stderr.strip().splitlines()) == 1
    missing = replay_cli("traces", "query", "SELECT 1", "-c", tmp_path / "nowhere")
    assert missing.returncode == 2 and "no catalog there" in missing.stderr


def test_ls_and_show_over_a_directory_in_parallel(tmp_path):
    for i in range(4):
        _trace(tmp_path / f"t{i}.parquet", 10 + i, 5, 50)
    (tmp_path / "t2x.parquet").write_text("garbage")
    done = replay_cli("traces", "ls", tmp_path, "-j", "2", timeout=300)
    assert done.returncode == 1 and "1 of" in done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if str(tmp_path) in line]
    assert listed == [str(tmp_path / n) for n in ("t0.parquet", "t1.parquet", "t2.parquet",
                                                   "t2x.parquet", "t3.parquet")]
    done = replay_cli("traces", "show", tmp_path, "--json", "-j", "2", timeout=300)
    assert done.returncode == 1 and "t2x.parquet" in done.stderr
    reports = json.loads(done.stdout)
    assert [r["characterisation"]["reads"] for r in reports] == [10, 11, 12, 13]


def test_the_single_machine_path_imports_neither_ray_nor_duckdb(tmp_path):
    code = ("import sys; import replay.cli, replay.cluster, replay.multihost, replay.commands.cluster, "
            "analysis.catalog; "
            "from replay.cluster import run_each; from analysis.catalog import describe_file; "
            f"list(run_each(describe_file, [{str(tmp_path / 'a.parquet')!r}], jobs=1)); "
            "print(sorted(m for m in ('ray', 'duckdb') if m in sys.modules))")
    _trace(tmp_path / "a.parquet", 1, 1, 1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("args,message", [
    (["traces", "catalog", "nowhere"], "no such directory"),
])
def test_bad_library_arguments_are_one_line(tmp_path, args, message):
    done = replay_cli(*args, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr


# ---- the catalog answers queries, and only queries of a catalog ------------------------------

def test_a_catalog_query_cannot_write_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "catalog.parquet"
    catalog.write_catalog([{"path": "a.parquet"}], path)
    assert catalog.query(path, "SELECT count(*) FROM catalog")[1] == [(1,)]
    out = tmp_path / "copy.csv"
    with pytest.raises(ReplayError, match="the query failed"):
        catalog.query(path, f"COPY (SELECT 1) TO '{out}'")
    assert not out.exists()
    with pytest.raises(ReplayError, match="the query failed"):
        catalog.query(path, "SET enable_external_access = true")


def test_a_trace_given_as_the_catalog_is_refused(tmp_path):
    from pathlib import Path

    trace = Path(__file__).parents[2] / "traces" / "demo.parquet"
    with pytest.raises(ReplayError, match="not a catalog"):
        catalog.query(trace, "SELECT 1")
