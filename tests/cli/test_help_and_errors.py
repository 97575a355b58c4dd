"""The `replay` command line as a user meets it: help, --json output, and errors printed as
one line with exit code 2, run in a real process so stray tracebacks would show.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_process import replay_cli
from traces.schema import Op
from traces.trace import read_trace, write_trace

MIB = 1 << 20
RUN_FLAGS = ["--speed", "--afap", "--qd", "--max-inflight", "--engine", "--remap", "--read-only",
             "--dry-run", "--data", "-o", "--output", "--json", "--destroy-data"]


def test_run_help_documents_every_flag():
    done = replay_cli("run", "--help")
    assert done.returncode == 0, done.stderr
    for flag in RUN_FLAGS:
        assert f" {flag}" in done.stdout, f"{flag} is missing from `replay run --help`"
    assert "Example: replay run" in done.stdout


def test_every_command_is_in_the_readme_and_every_run_option_in_the_docs():
    import typer

    from replay.cli import app

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    replaying = (Path(__file__).resolve().parents[2] / "docs" / "replaying.md").read_text()
    group = typer.main.get_command(app)
    assert group.commands, "replay has no commands"
    for name, command in group.commands.items():
        assert command.help, f"`replay {name}` has no help"
        assert f"replay {name}" in readme, f"`replay {name}` is not in the README"
    options = [p for p in group.commands["run"].params if p.opts[0].startswith("-")]
    assert {opt for p in options for opt in p.opts} >= set(RUN_FLAGS)
    for param in options:
        assert param.help, f"{param.opts[0]} has no help"
        long = max(param.opts, key=len)
        assert long in replaying, f"`replay run {long}` is not in docs/replaying.md"


def test_json_summary_has_fio_keys(tmp_path):
    out = tmp_path / "demo.parquet"
    done = replay_cli("run", "demo", "--engine", "null", "--afap", "--json", "-o", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    cols, _ = read_trace(out)
    reads = int(np.count_nonzero(cols["op"] == Op.READ))
    job = report["jobs"][0]
    assert job["read"]["total_ios"] == reads > 0
    assert job["read"]["iops"] > 0
    percentiles = job["read"]["clat_ns"]["percentile"]
    assert "50.000000" in percentiles and "99.900000" in percentiles
    assert all(v >= 0 for v in percentiles.values())
    assert job["write"]["io_bytes"] == int(cols["result"][cols["op"] == Op.WRITE].sum())
    assert report["tracereplay"]["output"] == str(out)
    assert report["tracereplay"]["interrupted"] is False
    assert report["tracereplay"]["total_ios"] == len(cols["op"])


def _trace(path, span):
    write_trace(path, {"ts_ns": np.array([0, 1000], dtype=np.int64),
                       "op": np.array([Op.READ, Op.READ], dtype=np.uint8),
                       "offset": np.array([0, span - 4096], dtype=np.int64),
                       "length": np.array([4096, 4096], dtype=np.int64)}, {"name": path.stem})
    return path


def _missing_trace(tmp_path):
    return [tmp_path / "nowhere" / "missing.parquet"], "missing.parquet: no such trace file"


def _not_parquet(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("ts_ns,op,offset,length\n0,0,0,4096\n")
    return [bad], "not a readable Parquet file"


def _too_small_target(tmp_path):
    target = tmp_path / "small.img"
    with open(target, "wb") as f:
        f.truncate(1 * MIB)
    trace = _trace(tmp_path / "wide.parquet", 8 * MIB)
    return [trace, target], f"spans 8.0 MiB ({8 * MIB} bytes) but {target} holds 1.0 MiB"


def _unknown_name(tmp_path):
    from traces import library

    # Every bundled trace, by name, in order: the list grows as traces are added.
    return ["no-such-trace"], f"not a file and not a bundled trace; bundled traces are: {', '.join(library.available())}"


@pytest.mark.parametrize("case", [_missing_trace, _not_parquet, _too_small_target, _unknown_name],
                         ids=["missing-trace", "not-parquet", "target-too-small", "unknown-name"])
def test_errors_are_one_line_and_exit_2(tmp_path, case):
    args, expected = case(tmp_path)
    out = tmp_path / "out.parquet"
    done = replay_cli("run", *args, "-o", out, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert expected in errors[0]
    assert all(line.startswith(("error: ", "note: ")) for line in done.stderr.splitlines())
    assert not out.exists()
