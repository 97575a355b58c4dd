"""The promises the documentation makes about bench/: every script takes --quick and --json,
and the README's figures about the bundled traces are what bench/trace_figures.py computes."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text()
                 and p.name != "_harness.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_bench_script_takes_quick_and_json(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout and "--json" in done.stdout, f"{script} lacks --quick or --json"


def test_the_readme_oltp_figures_come_from_trace_figures():
    sys.path.insert(0, str(BENCH))
    try:
        from trace_figures import figures
    finally:
        sys.path.remove(str(BENCH))
    from traces.library import resolve

    f = figures(resolve("oltp"))
    readme = " ".join((REPO / "README.md").read_text().split())
    said = re.search(r"For `oltp` the file is (\d+) GiB; the trace writes ([\d.]+) GB, to ([\d.]+) GB "
                     r"of distinct blocks", readme)
    assert said, "the README's set-up no longer states the oltp demo's figures"
    assert int(said.group(1)) == round(f["span_bytes"] / 2**30)
    assert said.group(2) == f"{f['written_bytes'] / 1e9:.2f}"
    assert said.group(3) == f"{f['distinct_written_bytes'] / 1e9:.2f}"
    assert f["written_bytes"] >= f["distinct_written_bytes"] > 0


def test_afap_vs_fio_tries_psync_with_jobs_and_names_the_configuration():
    """fio's best configuration on zram is psync with one job per CPU (issue 13): the
    benchmark must keep trying it and name the peer beside every ratio."""
    sys.path.insert(0, str(BENCH))
    try:
        from afap_vs_fio import config_name, fio_args, fio_configs
    finally:
        sys.path.remove(str(BENCH))
    assert fio_configs(32, 2) == [("io_uring", 1, 32), ("libaio", 1, 32), ("psync", 2, 1), ("io_uring", 2, 16)]
    assert ("psync", 1, 1) in fio_configs(1, 2)
    assert [config_name(c) for c in fio_configs(32, 2)] == \
        ["io_uring QD32", "libaio QD32", "psync x2 jobs", "io_uring 2 jobs x QD16"]
    args = fio_args("/dev/zram0", "randread", ("psync", 2, 1), 1000, 1 << 30)
    assert {"--ioengine=psync", "--numjobs=2", "--iodepth=1", f"--io_size={500 * 4096}"} <= set(args)


def test_causal_bench_replays_a_capture_without_its_sleeps_from_a_copy(tmp_path):
    import numpy as np

    from bench.causal import without_sleeps
    from traces.trace import read_trace, write_trace

    cols = {"ts_ns": np.array([0, 10], np.int64), "op": np.zeros(2, np.uint8), "offset": np.zeros(2, np.int64),
            "length": np.full(2, 4096, np.int64), "latency_ns": np.array([5, 5], np.int64),
            "pid": np.array([7, 7], np.int32)}
    trace = write_trace(tmp_path / "t.parquet", cols, {"source": {"sleeps": {"pid": [7], "start_ns": [6],
                                                                              "end_ns": [9]}}})
    copy = without_sleeps(trace, tmp_path)
    got, meta = read_trace(copy)
    assert meta["source"]["sleeps"] is None and got["ts_ns"].tolist() == [0, 10]
    assert read_trace(trace)[1]["source"]["sleeps"]["pid"] == [7]  # the capture itself is untouched


def test_causal_bench_has_fixed_work_for_every_recipe():
    from bench.causal import WORKLOADS
    from traces.capture.recipes import RECIPES, load
    from traces.capture.recipes.common import parse_knobs

    assert set(WORKLOADS) == set(RECIPES)
    for name, sets in WORKLOADS.items():
        module = load(name)
        for knobs in sets:
            flags, values = knobs[0::2], knobs[1::2]
            assert all(f.startswith("--") for f in flags) and len(flags) == len(values), (name, knobs)
            given = {f[2:].replace("-", "_"): v for f, v in zip(flags, values)}
            parse_knobs(module.KNOBS, given)  # every knob exists and its value converts
            # Fixed work: a recipe that can run for a duration is given a count instead.
            assert "duration" not in given
            if "duration" in module.KNOBS:
                assert {"ops", "transactions"} & set(given), (name, knobs)


def test_causal_bench_refuses_an_unknown_workload():
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench" / "causal.py"
    done = subprocess.run([sys.executable, bench, "--workloads", "blob,nosuch"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no fixed work for nosuch" in done.stderr and "Traceback" not in done.stderr


def test_causal_bench_names_real_runs_taken_beside_other_work():
    from bench.causal import other_work, shared

    quiet = {"elapsed_s": 2.0, "niced_cpu_s": 0.05, "cpu_pressure": 0.4}
    busy = {"elapsed_s": 2.0, "niced_cpu_s": 1.5, "cpu_pressure": 0.9}
    assert not shared(quiet, 2) and shared(busy, 2)
    assert not shared({"elapsed_s": 2.0}, 2)  # a capture from before the timer recorded it
    assert other_work(busy) == "1.50 CPU-s niced, CPU pressure 90 %" and other_work({"elapsed_s": 1}) == "-"


def test_causal_bench_other_work_runs_niced_in_sessions_of_its_own():
    import os

    from bench.causal import other_sessions

    hogs = other_sessions(2)
    try:
        for hog in hogs:
            assert os.getsid(hog.pid) == hog.pid != os.getsid(0)  # a session (an autogroup) each
            fields = open(f"/proc/{hog.pid}/stat").read().rsplit(")", 1)[1].split()
            assert int(fields[16]) == 19  # nice
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
