"""Inputs users give the newest features, each answered with one clear line."""
import pytest

from analysis import catalog
from traces.errors import ReplayError


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
