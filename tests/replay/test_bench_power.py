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
from tests.replay.test_bench_charts import spy
from tests.replay.test_run_end_to_end import marks, on_loop, uring

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


# ---- the power of what the charts headline, and the charts -----------------------------------

B = 1_800_000_000.0


def test_headline_power_scores_from_a_hand_made_log(tmp_path):
    from datetime import datetime, timezone

    from analysis.power import read_log
    from replay.bench.scores import power_scores

    def at(s):
        return datetime.fromtimestamp(B + s, timezone.utc).isoformat()

    log_path = tmp_path / "meter.csv"
    watts = (2, 2, 2, 2, 2, 2, 4, 4, 6, 6, 8)  # B + 0 .. B + 10
    log_path.write_text("t,W\n" + "".join(f"{B + i},{w}\n" for i, w in enumerate(watts)))
    log = read_log(log_path, ("t", "W"))
    # steady: a 10 s run from B, scored on its last 4 s, [6, 10]: trapezoids 4, 5, 6, 7 J,
    # 22 J / 4 s = 5.5 W; 1,100 IOPS of 4 KiB are 4.5056 MB/s: 0.8192 MB/s/W, 200 IOPS/W.
    runs = [{"name": "op25-steady", "started": at(0), "summary": {"duration_ns": 10 * 10**9}}]
    s = power_scores("steady", {"steady_iops": 1100.0, "window_s": 4}, runs, "op25-", log)
    assert s == pytest.approx({"steady_average_w": 5.5, "steady_mb_per_s_per_w": 0.8192,
                               "steady_iops_per_w": 200.0, "steady_power_covered": 1.0})
    assert power_scores("steady", {"steady_iops": 1100.0, "window_s": 4}, runs, "", log) == {}
    # mix: the 70/30 point's run, under its split's key; ACT: the run at the passing multiple.
    p = {"average_w": 3.0, "mb_per_s_per_w": 80.0, "iops_per_w": 20480.0, "covered_share": 1.0}
    table = [{"run": "32x1-r100", "read_share": 1.0, "workers": 32, "qd": 1, "data": "random"},
             {"run": "32x1-r70", "read_share": 0.7, "workers": 32, "qd": 1, "data": "random"}]
    runs = [{"name": "32x1-r100", "power": {**p, "average_w": 9.0}}, {"name": "32x1-r70", "power": p}]
    assert power_scores("mix", {"table": table}, runs, "", log) == {
        "average_w_70_30_32x1": 3.0, "mb_per_s_per_w_70_30_32x1": 80.0,
        "iops_per_w_70_30_32x1": 20480.0}
    runs = [{"name": "act-x3", "power": {**p, "average_w": 9.0}}, {"name": "act-x2", "power": p}]
    assert power_scores("act", {"act_multiple": 2.0, "passed": True}, runs, "", log) == {
        "act_average_w": 3.0, "act_mb_per_s_per_w": 80.0, "act_iops_per_w": 20480.0}
    assert power_scores("act", {"act_multiple": 2.0, "passed": False}, runs, "", log) == {}


def metered_bench(tmp_path, out, *args):
    log = tmp_path / f"{out.name}.csv"
    meter = Meter(log)
    meter.start()
    try:
        r = replay_cli("bench", *args, "-o", out, "--power-log", log,
                       "--power-start", repr(meter.start_s), timeout=300)
    finally:
        meter.stop()
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "results.json").read_text())


def check_power_charts(tmp_path, monkeypatch, mix, steady, label="t"):
    """The report's power charts of a metered mix set and steady set: every value the runs'
    own power (7.25 W, the meter's constant) and their MB/s over it."""
    from analysis import report

    drawn = spy(monkeypatch, "sweep_mb", "power_bars")
    report.build_report([tmp_path / "mix", tmp_path / "steady"], tmp_path / "r.html",
                        labels=[label, label])
    power = {r["name"]: r["power"] for r in mix["runs"]}
    by_title = {}
    for chart in drawn["sweep_mb"]:
        by_title.setdefault(chart.unit, []).append(chart)
    (watts,), (eff,) = by_title["W"], by_title["MB/s/W"]
    table = mix["scores"]["table"]
    name = f"{label}: mix QD4"
    assert watts.lines == {name: ([0.0, 0.7, 1.0], [power[r["run"]]["average_w"] for r in table][::-1])}
    assert eff.lines[name][1] == [power[r["run"]]["mb_per_s_per_w"] for r in table][::-1]
    assert all(w == pytest.approx(7.25) for w in watts.lines[name][1])
    assert [pytest.approx(r["mb_per_s"] / 7.25) for r in table][::-1] == eff.lines[name][1]
    assert watts.headline == {name: mix["scores"]["average_w_70_30_1x4"]}
    assert eff.headline == {name: mix["scores"]["mb_per_s_per_w_70_30_1x4"]}
    (bars,) = drawn["power_bars"]
    s = steady["scores"]
    assert bars.bars == {f"{label}: steady, 70 % reads": (s["steady_average_w"], s["steady_mb_per_s_per_w"])}
    assert s["steady_average_w"] == pytest.approx(7.25)
    assert s["steady_mb_per_s_per_w"] == pytest.approx(s["steady_iops"] * 4096 / 1e6 / 7.25)
    files = {p.stem for p in (tmp_path / "r_files").iterdir()}
    assert {"mix_power", "mix_efficiency", "steady_power"} <= files


MIX = ("mix", "--qd", "4", "--read-shares", "100,70,0", "--duration", "0.3", "--no-fill",
       "--span", "16M")
STEADY = ("steady", "--read-share", "70", "--duration", "3", "--window", "2", "--round", "1",
          "--no-fill", "--span", "16M")


def test_the_report_draws_the_power_of_a_metered_bench(tmp_path, monkeypatch):
    r, mix = metered_bench(tmp_path, tmp_path / "mix", *MIX, "--engine", "null")
    assert "average power at 70/30 QD4: 7.25 W" in r.stdout
    assert f"efficiency at 70/30 QD4: {mix['scores']['mb_per_s_per_w_70_30_1x4']:,.0f} MB/s/W" in r.stdout
    r, steady = metered_bench(tmp_path, tmp_path / "steady", *STEADY, "--engine", "null")
    assert "average power over the scored window: 7.25 W" in r.stdout
    check_power_charts(tmp_path, monkeypatch, mix, steady)


def test_sets_without_power_draw_no_power_chart(tmp_path, monkeypatch):
    from analysis import report

    for name, args in (("mix", MIX), ("steady", STEADY)):
        r = replay_cli("bench", *args, "--engine", "null", "-o", tmp_path / name, timeout=300)
        assert r.returncode == 0, r.stderr
    drawn = spy(monkeypatch, "sweep_mb", "power_bars")
    page = report.build_report([tmp_path / "mix", tmp_path / "steady"], tmp_path / "r.html",
                               labels=["t", "t"]).read_text()
    assert [c.unit for c in drawn["sweep_mb"]] == ["MB/s"] and drawn["power_bars"] == []
    assert "power" not in page.lower()  # silently: nothing was measured
    # Beside a metered set, the one without power is named in one line.
    metered_bench(tmp_path, tmp_path / "metered", *MIX, "--engine", "null")
    page = report.build_report([tmp_path / "metered", tmp_path / "mix"], tmp_path / "r2.html",
                               labels=["a", "b"]).read_text()
    assert "No power chart for b: mix: run without --power-log." in page


@marks(uring, on_loop)
def test_power_charts_of_a_metered_bench_on_a_loop_device(tmp_path, monkeypatch, loop_device):
    device = loop_device(32 * (1 << 20))
    r, mix = metered_bench(tmp_path, tmp_path / "mix", *MIX[:1], device, *MIX[1:], "--engine", "io_uring")
    assert mix["target"]["kind"] == "block" and mix["scores"]["iops_70_30_1x4"] > 0
    r, steady = metered_bench(tmp_path, tmp_path / "steady", *STEADY[:1], device, *STEADY[1:],
                              "--engine", "io_uring")
    check_power_charts(tmp_path, monkeypatch, mix, steady)


def test_the_report_draws_acts_power_at_the_passing_multiple(tmp_path, monkeypatch):
    from analysis import report

    r, act = metered_bench(tmp_path, tmp_path / "act", "act", "--engine", "null", "--search",
                           "--start", "3", "--step", "1", "--duration", "1", "--period", "1",
                           "--no-prep", "--span", "64M")
    s = act["scores"]
    assert s["passed"]  # the null engine keeps up with a few times ACT's load
    (run,) = [x for x in act["runs"] if x["name"] == f"act-x{s['act_multiple']:g}"]
    assert s["act_average_w"] == pytest.approx(7.25) == run["power"]["average_w"]
    assert s["act_mb_per_s_per_w"] == pytest.approx(run["summary"]["mb_per_s"] / 7.25)
    assert "ACT's average power at its passing multiple: 7.25 W" in r.stdout
    drawn = spy(monkeypatch, "sweep_mb", "power_bars")
    report.build_report([tmp_path / "act"], tmp_path / "r.html", labels=["t"])
    (bars,) = drawn["power_bars"]
    assert bars.bars == {f"t: act at {s['act_multiple']:g}x": (s["act_average_w"], s["act_mb_per_s_per_w"])}
    assert "act_power" in {p.stem for p in (tmp_path / "r_files").iterdir()}
