"""The committed corpus of bad input (tests/data/bad: malformed traces, results files and
option sets) through the real CLI: each is refused with exit 2 and one line on stderr, no
traceback, and nothing left behind."""
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli_process import replay_cli
from traces.trace import write_trace

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"


def _commands(path: Path) -> list[list[str]]:
    """The command lines that must refuse `path` ({tmp}, {trace}, {target} filled in later)."""
    name, bad = path.name, str(path)
    if name.startswith("trace-"):
        return [["run", bad, "{target}", "--engine", "null", "-o", "{tmp}/out.parquet"]]
    if name.startswith("results-"):
        return [["compare", bad, bad], ["report", bad, "-o", "{tmp}/report.html"],
                ["verdict", "--synthetic-a", bad, "--synthetic-b", bad, "--traces-a", bad, "--traces-b", bad]]
    args = path.read_text().split()
    if "-o" not in args:
        args += ["-o", "{tmp}/out.parquet"]
    return [["run", "{trace}", "{target}", "--engine", "null", *args]]


CASES = [pytest.param(cmd, id=f"{path.stem}-{cmd[0]}")
         for pattern in ("trace-*", "results-*", "options-*")
         for path in sorted(BAD.glob(pattern))
         for cmd in _commands(path)]


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.is_dir() or _digest(p) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("command", CASES)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(tmp_path, command):
    work = tmp_path / "work"
    work.mkdir()
    trace = work / "good.parquet"
    write_trace(trace, {"ts_ns": np.arange(4, dtype=np.int64) * 1000, "op": np.zeros(4, np.uint8),
                        "offset": np.arange(4, dtype=np.int64) * 4096, "length": np.full(4, 4096, np.int64)},
                {"name": "good"})
    target = work / "disk.img"
    with open(target, "wb") as f:
        f.truncate(1 << 20)
    corpus, before = _snapshot(BAD), _snapshot(work)
    args = [a.format(tmp=work, trace=trace, target=target) for a in command]
    done = replay_cli(*args, cwd=work)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert _snapshot(work) == before, "a file was left behind or changed"
    assert _snapshot(BAD) == corpus


def test_the_corpus_is_what_its_script_writes(tmp_path):
    # The binary files are committed; the script that made them must still make them.
    copy = tmp_path / "bad"
    shutil.copytree(BAD, copy)
    for p in copy.glob("*.parquet"):
        p.unlink()
    import runpy

    runpy.run_path(str(copy / "make_corpus.py"), run_name="__main__")
    made = sorted(p.name for p in copy.glob("*.parquet"))
    assert made == sorted(p.name for p in BAD.glob("*.parquet") if not p.name.startswith("import-"))
    for name in made:  # the same rows and metadata (the bytes name the pyarrow version)
        assert _table(copy / name) == _table(BAD / name), name


def _table(path):
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - unreadable on purpose: compare how
        return type(e).__name__


@pytest.mark.parametrize("name", ["trace-empty", "trace-unsorted-ts", "trace-unknown-op", "trace-truncated"])
def test_traces_verify_calls_the_bad_traces_invalid(name):
    # verify's own contract: exit 1 and one "invalid: ..." line for a trace it checked.
    done = replay_cli("traces", "verify", BAD / f"{name}.parquet")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout.startswith("invalid: ") and len(done.stdout.splitlines()) == 1, done.stdout
    assert "Traceback" not in done.stderr
