"""analysis.power: a meter's log read onto the wall clock (Quarch's layout, other meters' by
column name) and averaged over a run's window, checked against averages worked out by hand.
"""
import math

import pytest

from analysis.power import PowerLogError, parse_when, read_log, run_power, window_average

B = 1_800_000_000.0  # a Unix second; the hand-made log's samples are at B + 0 .. B + 4
WATTS = (2, 4, 4, 8, 6)


@pytest.fixture
def quarch(tmp_path):
    """The hand-made log as Quarch writes it: time since the recording's start in us, each
    rail's mV, uA and uW, and the total in uW."""
    path = tmp_path / "quarch.csv"
    lines = ["Time us,12V mV,12V uA,12V uW,Tot uW"]
    lines += [f"{i * 1_000_000},12000,{w * 1_000_000 // 12},{w * 1_000_000},{w * 1_000_000}"
              for i, w in enumerate(WATTS)]
    path.write_text("\n".join(lines) + "\n")
    return read_log(path, start=B)


def test_quarch_layout_is_read_in_seconds_and_watts(quarch):
    assert quarch.t_s.tolist() == [B + i for i in range(5)]
    assert quarch.watts.tolist() == list(map(float, WATTS))


@pytest.mark.parametrize("lo, hi, watts, covered", [
    # [1, 3]: 1 s at (4 + 4) / 2 = 4 J, 1 s at (4 + 8) / 2 = 6 J; 10 J / 2 s = 5 W.
    (1.0, 3.0, 5.0, 2.0),
    # [0.5, 1.5]: 2 W -> 4 W puts 3 W at 0.5; 0.5 s at (3 + 4) / 2 = 1.75 J, 0.5 s at 4 W = 2 J;
    # 3.75 J / 1 s = 3.75 W.
    (0.5, 1.5, 3.75, 1.0),
    # [3.5, 10] is clipped to the log's end, [3.5, 4]: 7 W at 3.5, 6 W at 4, 6.5 W over 0.5 s.
    (3.5, 10.0, 6.5, 0.5),
    # The whole log: (3 + 4 + 6 + 7) J / 4 s = 5 W.
    (-1.0, 4.0, 5.0, 4.0),
])
def test_window_average_by_hand(quarch, lo, hi, watts, covered):
    assert window_average(quarch, B + lo, B + hi) == pytest.approx((watts, covered), abs=1e-6)


def test_a_window_outside_the_log_has_no_average(quarch):
    assert window_average(quarch, B + 5, B + 6) is None
    assert window_average(quarch, B - 3, B - 1) is None
    assert run_power(quarch, B + 4, 1.0, 100.0, 1000.0) is None  # touching the end is no overlap


def test_run_power_and_efficiency_by_hand(quarch):
    # [1, 3] averages 5 W (above): 100 MB/s / 5 W = 20 MB/s/W, 25,600 IOPS / 5 W = 5,120 IOPS/W.
    p = run_power(quarch, B + 1, 2.0, 100.0, 25_600.0)
    assert p["average_w"] == pytest.approx(5.0)
    assert p["mb_per_s_per_w"] == pytest.approx(20.0)
    assert p["iops_per_w"] == pytest.approx(5120.0)
    assert p["covered_share"] == 1.0
    # [3.5, 10]: 0.5 s of 6.5 covered, 1 / 13, at 6.5 W.
    p = run_power(quarch, B + 3.5, 6.5, 13.0, 650.0)
    assert p["covered_share"] == pytest.approx(1 / 13)
    assert p["mb_per_s_per_w"] == pytest.approx(2.0)


def test_other_meters_by_column_name_and_unit(tmp_path):
    # Unix milliseconds with the unit in the header, milliwatts, extra columns around them.
    path = tmp_path / "meter.csv"
    path.write_text("volts,stamp ms,power (mW)\n"
                    + "".join(f"12,{int((B + i) * 1000)},{w * 1000}\n" for i, w in enumerate(WATTS)))
    log = read_log(path, columns=("stamp", "power"))
    assert log.t_s.tolist() == [B + i for i in range(5)]
    assert window_average(log, B + 1, B + 3)[0] == pytest.approx(5.0)
    # The time unit given where the header names none; ISO 8601 instants need no start.
    path.write_text("t,W\n" + "".join(f"{int(B + i) * 10**9},{w}\n" for i, w in enumerate(WATTS)))
    assert read_log(path, ("t", "W"), time_unit="ns").t_s[0] == B
    path.write_text("when,W\n2027-01-15T08:00:00+00:00,2\n2027-01-15T08:00:02+00:00,4\n")
    log = read_log(path, ("when", "W"))
    assert log.start_s == parse_when("2027-01-15T08:00:00Z") and log.end_s - log.start_s == 2
    assert window_average(log, log.start_s, log.end_s)[0] == pytest.approx(3.0)


@pytest.mark.parametrize("text, columns, says", [
    ("Time us,Tot uW\n0,1\n", None, "at least two"),
    ("Time us,12V uW\n0,1\n1,2\n", None, "no column 'Tot uW'"),
    ("Time us,Tot uW\n0,1\n5,2\n5,3\n", None, "do not rise"),
    ("Time us,Tot uW\n0,1\nsoon,2\n", None, "line 3"),
    ("a,b\n0,1\n1,nan\n", ("a", "b"), "finite"),
])
def test_bad_logs_are_one_sentence(tmp_path, text, columns, says):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(PowerLogError, match=says) as e:
        read_log(path, columns, start=0.0 if columns is None else None)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_parse_when():
    assert parse_when("1800000000.5") == 1_800_000_000.5
    assert math.isclose(parse_when("1970-01-01T00:01:00+00:00"), 60.0)
    with pytest.raises(PowerLogError, match="not a time"):
        parse_when("yesterday")
