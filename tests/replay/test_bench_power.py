"""`replay bench --power-log` and `replay run --power-log`: a meter's log, written in Quarch's
layout while a real (null engine) bench or run goes, aligned to each run; a log from another
time refused in one sentence.
"""
import json
import os
import threading
import time

import pytest

from tests.cli_process import replay_cli

# A small mix: two 0.3 s points at QD3 on the null engine, no fill.
BENCH = ("bench", "mix", "--engine", "null", "--qd", "3", "--read-shares", "100,0",
         "--duration", "0.3", "--no-fill", "--span", "64M")
MICROWATTS = 7_250_000  # the sampler's total, 7.25 W, on every sample


class Meter(threading.Thread):
    """A Quarch module's stream to CSV as QIS writes it: the time since the recording's start
    in us, the 12 V rail's mV, uA and uW, and the total uW, one sample every 5 ms, each line
    in one write so that a reader never sees half a line."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self.fd, b"Time us,12V mV,12V uA,12V uW,Tot uW\n")
        self.start_s, self.done = time.time(), threading.Event()

    def run(self):
        while not self.done.wait(0.005):
            us = int((time.time() - self.start_s) * 1e6)
            os.write(self.fd, f"{us},12000,604166,{MICROWATTS},{MICROWATTS}\n".encode())

    def stop(self):
        self.done.set()
        self.join()
        os.close(self.fd)


def test_power_log_written_during_a_real_bench(tmp_path):
    log, out = tmp_path / "quarch.csv", tmp_path / "out"
    meter = Meter(log)
    meter.start()
    try:
        r = replay_cli(*BENCH, "-o", out, "--power-log", log, "--power-start", repr(meter.start_s))
    finally:
        meter.stop()
    assert r.returncode == 0, r.stderr
    results = json.loads((out / "results.json").read_text())
    assert [run["name"] for run in results["runs"]] == ["1x3-r100", "1x3-r0"]
    for run in results["runs"]:
        p, s = run["power"], run["summary"]
        # A constant 7.25 W averages 7.25 W whatever the window; the log began before the
        # run and ended after it, so it covers it all.
        assert p["average_w"] == pytest.approx(7.25)
        assert p["covered_share"] == 1.0
        assert p["mb_per_s_per_w"] == pytest.approx(s["mb_per_s"] / 7.25)
        assert p["iops_per_w"] == pytest.approx(s["iops"] / 7.25)
        assert f"{run['name']:<26}    7.25" in r.stdout
    assert results["power"]["log"] == str(log) and results["power"]["samples"] > 10
    assert f"power from {log}:" in r.stdout


def test_a_log_that_overlaps_no_run_is_refused(tmp_path):
    log, out = tmp_path / "old.csv", tmp_path / "out"
    # An hour-old recording of 2 s: the runs, started now, are all after its end.
    log.write_text("Time us,Tot uW\n0,5000000\n1000000,5000000\n2000000,5000000\n")
    r = replay_cli(*BENCH, "-o", out, "--power-log", log, "--power-start", str(time.time() - 3600))
    assert r.returncode == 2
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the power log") and "does not overlap the runs" in error
    assert "Traceback" not in r.stderr
    # Nothing lost: the runs are kept, without power.
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"]) == 2 and results["power"] is None
    assert all("power" not in run for run in results["runs"])


@pytest.mark.parametrize("args, says", [
    (("--power-time-unit", "fortnights"), "--power-time-unit must be one of s, ms, us, ns"),
    (("--power-columns", "time"), "--power-columns takes two column names"),
    (("--power-start", "yesterday"), "'yesterday' is not a time"),
])
def test_bad_power_options_are_refused_before_any_run(tmp_path, args, says):
    r = replay_cli(*BENCH, "-o", tmp_path / "out", "--power-log", tmp_path / "none.csv", *args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_replay_run_takes_the_same_power_log(tmp_path):
    log, out = tmp_path / "quarch.csv", tmp_path / "demo.parquet"
    meter = Meter(log)
    meter.start()
    try:
        # The demo's 10 s of trace time at 50x: 0.2 s.
        r = replay_cli("run", "demo", "--engine", "null", "--speed", "50", "-o", out, "--json",
                       "--power-log", log, "--power-start", repr(meter.start_s))
    finally:
        meter.stop()
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["tracereplay"]
    assert t["power"]["average_w"] == pytest.approx(7.25) and t["power"]["covered_share"] == 1.0
    assert t["power"]["iops_per_w"] == pytest.approx(t["iops"] / 7.25)
    # Without --json, one line; a log from an hour ago is refused, the results file kept.
    old = tmp_path / "old.csv"
    old.write_text("Time us,Tot uW\n0,5000000\n1000000,5000000\n")
    r = replay_cli("run", "demo", "--engine", "null", "--speed", "50", "-o", out, "--force",
                   "--power-log", old, "--power-start", str(time.time() - 3600))
    assert r.returncode == 2 and "does not overlap the runs" in r.stderr
    assert f"the run's results are kept in {out}" in r.stderr and out.exists()
