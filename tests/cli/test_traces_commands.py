"""`replay traces ls|show|verify` as a user runs them, in a real process so tracebacks would show."""
import json

import numpy as np
import pytest

from tests.cli_process import replay_cli
from traces.schema import Op
from traces.trace import write_trace


def _trace(path, device_size=None, offsets=(0, 8192, 12288, 0), ops=None):
    ops = ops or [Op.READ, Op.READ, Op.WRITE, Op.FLUSH]
    lengths = [0 if o == Op.FLUSH else 4096 for o in ops]
    meta = {"name": path.stem, "source": {"kind": "synth:test"}}
    if device_size is not None:
        meta["device_size"] = device_size
    write_trace(path, {"ts_ns": np.arange(len(ops), dtype=np.int64) * 1_000_000,
                       "op": np.array(ops, np.uint8), "offset": np.array(offsets, np.int64),
                       "length": np.array(lengths, np.int64)}, meta)
    return path


def test_ls_lists_the_library_and_a_directory(tmp_path):
    _trace(tmp_path / "mine.parquet")
    (tmp_path / "broken.parquet").write_text("not parquet")
    done = replay_cli("traces", "ls", tmp_path)
    assert done.returncode == 1, done.stderr  # a file is not a valid trace
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "I/Os", "duration"]
    demo = next(line for line in lines if line.startswith("demo "))
    assert "synth:demo" in demo and "8KiB" in demo
    mine = next(line for line in lines if "mine.parquet" in line).split()
    # name, I/Os, duration, read share by count/bytes, sizes, span, source
    assert mine[1:] == ["4", "0.0s", "67/67", "4KiB", "16KiB", "synth:test"]
    broken = next(line for line in lines if "broken.parquet" in line)
    assert "invalid:" in broken and "not a readable Parquet file" in broken


def test_ls_of_a_missing_directory_is_an_error(tmp_path):
    done = replay_cli("traces", "ls", tmp_path / "nowhere")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "no such directory" in done.stderr


def test_show_json_has_metadata_and_characterisation(tmp_path):
    path = _trace(tmp_path / "mine.parquet", device_size=1 << 20)
    done = replay_cli("traces", "show", path, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["metadata"]["name"] == "mine" and report["metadata"]["device_size"] == 1 << 20
    c = report["characterisation"]
    assert (c["ios"], c["reads"], c["writes"], c["flushes"]) == (4, 2, 1, 1)
    assert c["working_set_bytes"] == 3 * 4096 and c["span_bytes"] == 16384
    assert c["sequential_share"] == pytest.approx(0)  # 0 then 8192: not contiguous


def test_show_text_of_the_demo(tmp_path):
    done = replay_cli("traces", "show", "demo")
    assert done.returncode == 0, done.stderr
    assert '"kind": "synth:demo"' in done.stdout
    for label in ("read share", "dominant sizes", "sequential", "inter-arrival", "working set", "size histogram"):
        assert label in done.stdout


def test_verify_valid_trace_exits_0(tmp_path):
    done = replay_cli("traces", "verify", _trace(tmp_path / "ok.parquet", device_size=1 << 20))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("valid: ") and "4 rows" in done.stdout


def _truncated(tmp_path):
    path = _trace(tmp_path / "cut.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path, "not a readable Parquet file"


def _beyond_device(tmp_path):
    return _trace(tmp_path / "big.parquet", device_size=8192), "past device_size 8192"


def _corrupt_metadata(tmp_path):
    path = _trace(tmp_path / "meta.parquet")
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"schema_version": 1', b'"schema_version": 9'))
    return path, "schema_version 9"


def _bad_op(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "op.parquet"
    table = pa.table({"ts_ns": pa.array([0, 1], pa.int64()), "op": pa.array([0, 9], pa.uint8()),
                      "offset": pa.array([0, 0], pa.int64()), "length": pa.array([4096, 4096], pa.int64())})
    pq.write_table(table, path)
    return path, "unknown op 9"


@pytest.mark.parametrize("case", [_truncated, _beyond_device, _corrupt_metadata, _bad_op],
                         ids=["truncated", "beyond-device", "newer-schema", "bad-op"])
def test_verify_invalid_trace_exits_1_with_the_problem(tmp_path, case):
    path, expected = case(tmp_path)
    done = replay_cli("traces", "verify", path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("invalid: ") and expected in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_verify_unknown_name_exits_2(tmp_path):
    done = replay_cli("traces", "verify", "no-such-trace", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "bundled traces are" in done.stderr


def test_traces_commands_have_help():
    done = replay_cli("traces", "--help")
    assert done.returncode == 0
    for command in ("ls", "show", "verify"):
        assert command in done.stdout
        sub = replay_cli("traces", command, "--help")
        assert sub.returncode == 0 and "Example: replay traces" in sub.stdout
    capture = replay_cli("capture", "--help")
    for flag in ("--output", "--duration", "--backend", "--strict", "--name"):
        assert flag in capture.stdout
