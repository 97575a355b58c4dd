"""A power meter's log (a CSV of timestamps and watts, such as a Quarch power module's stream
or Power Studio export) read onto the wall clock, and each run's average power and
efficiency (MB/s/W, IOPS/W) over the part of the run the log covers.
"""
import csv
import math
import re
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from traces.errors import ReplayError

# Quarch's CSV (QIS stream and QPS export, header v3): the first column is the time since the
# recording started, its unit in the header ("Time us"), then per rail mV, uA and uW columns and
# the total over all rails, "Tot uW".
QUARCH_COLUMNS = ("Time", "Tot uW")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
WATT_UNITS = {"W": 1.0, "mW": 1e-3, "uW": 1e-6}


class PowerLogError(ReplayError, ValueError):
    """A power log that cannot be read or aligned; the message says what to change."""


@dataclass(frozen=True)
class PowerLog:
    """Samples on the wall clock: `t_s` Unix seconds, ascending; `watts` at each."""

    path: str
    t_s: np.ndarray
    watts: np.ndarray

    @property
    def start_s(self) -> float:
        return float(self.t_s[0])

    @property
    def end_s(self) -> float:
        return float(self.t_s[-1])


def _unit(header: str, units: dict, default: str) -> str:
    """The unit a column's header ends in ("Time us", "Tot uW", "power (W)"), else `default`."""
    words = re.split(r"[\s()\[\]]+", header.strip().strip(")]"))
    return words[-1] if len(words) > 1 and words[-1] in units else default


def _column(headers: list[str], name: str, path) -> int:
    """The column named `name`, or the only one whose name starts with it (Quarch's "Time")."""
    stripped = [h.strip() for h in headers]
    if name in stripped:
        return stripped.index(name)
    starting = [i for i, h in enumerate(stripped) if h.split(" ")[0] == name]
    if len(starting) == 1:
        return starting[0]
    raise PowerLogError(f"the power log {path} has no column {name!r} (its columns: "
                        f"{', '.join(stripped)}); name its time and watts columns with "
                        "--power-columns TIME,WATTS")


def parse_when(text: str) -> float:
    """A wall-clock instant as Unix seconds: a number of seconds, or ISO 8601 (without a zone,
    this host's local time, as meters write it)."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):  # nan and inf passed, and ended the run in a traceback
            return seconds
        raise PowerLogError(f"{text!r} is not a time: give Unix seconds or ISO 8601")
    try:
        return datetime.fromisoformat(text.strip()).astimezone().timestamp()
    except ValueError:
        raise PowerLogError(f"{text!r} is not a time: give Unix seconds or ISO 8601, for "
                            "example 2026-11-25T15:20:00+00:00") from None


def check_layout(columns: tuple | None, time_unit: str | None) -> None:
    """Refuse, before any run, a column mapping or time unit read_log could not use."""
    if time_unit not in (None, *TIME_UNITS):
        raise PowerLogError(f"--power-time-unit must be one of {', '.join(TIME_UNITS)}, not "
                            f"{time_unit!r}")
    if columns is not None and (len(columns) != 2 or not all(columns)):
        raise PowerLogError(f"--power-columns takes two column names, TIME,WATTS, not "
                            f"{','.join(columns)!r}")


def read_log(path, columns: tuple[str, str] | None = None, time_unit: str | None = None,
             start: float | None = None) -> PowerLog:
    """Read a power log. `columns` (time, watts) default to Quarch's; the time column's unit
    is `time_unit`, else the one its header names, else seconds; the watts column's unit the
    one its header names (W, mW, uW), else W. Times are Unix seconds, or ISO 8601 instants,
    unless `start` (Unix seconds) is given: then they count from that instant, as Quarch's do
    from the start of the recording."""
    check_layout(columns, time_unit)
    time_name, watts_name = columns or QUARCH_COLUMNS
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if any(cell.strip() for cell in r)]
    except (OSError, UnicodeDecodeError) as e:
        raise PowerLogError(f"cannot read the power log {path}: {e}") from None
    if len(rows) < 3:
        raise PowerLogError(f"the power log {path} holds {max(len(rows) - 1, 0)} samples; a run's "
                            "average needs at least two, after a header line")
    headers, rows = rows[0], rows[1:]
    ti, wi = _column(headers, time_name, path), _column(headers, watts_name, path)
    t_scale = TIME_UNITS[time_unit or _unit(headers[ti], TIME_UNITS, "s")]
    w_scale = WATT_UNITS[_unit(headers[wi], WATT_UNITS, "W")]
    times, watts = [], []
    for n, row in enumerate(rows, start=2):
        if max(ti, wi) >= len(row) or not row[wi].strip():
            continue  # Quarch leaves a rail's cell empty where it has no sample
        try:
            w = float(row[wi]) * w_scale
            try:
                t = float(row[ti]) * t_scale
            except ValueError:
                if start is not None:
                    raise
                t = parse_when(row[ti])
        except (ValueError, PowerLogError):
            raise PowerLogError(f"line {n} of the power log {path} is not a time and watts: "
                                f"{row[ti]!r}, {row[wi]!r}") from None
        times.append(t + (start or 0.0))
        watts.append(w)
    t_s, w = np.asarray(times, dtype=np.float64), np.asarray(watts, dtype=np.float64)
    if len(t_s) < 2 or not np.all(np.isfinite(t_s)) or not np.all(np.isfinite(w)):
        raise PowerLogError(f"the power log {path} needs at least two finite samples")
    if np.any(np.diff(t_s) <= 0):
        raise PowerLogError(f"the power log {path}'s times do not rise from line to line; give "
                            "the log as the meter wrote it")
    return PowerLog(str(path), t_s, w)


def window_average(log: PowerLog, start_s: float, end_s: float) -> tuple[float, float] | None:
    """(average watts, seconds covered) over [start_s, end_s] clipped to the log, the power
    drawn linearly between samples (the trapezoid rule, so uneven sampling weighs each sample
    by the time it stands for); None when the log does not overlap the window."""
    lo, hi = max(start_s, log.start_s), min(end_s, log.end_s)
    if not hi > lo:
        return None
    inside = (log.t_s > lo) & (log.t_s < hi)
    t = np.concatenate(([lo], log.t_s[inside], [hi]))
    w = np.interp(t, log.t_s, log.watts)
    energy_j = float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t)))
    return energy_j / (hi - lo), hi - lo


def run_power(log: PowerLog, start_s: float, duration_s: float, mb_per_s: float,
              iops: float) -> dict | None:
    """A run's power: its average over the part of [start_s, start_s + duration_s] the log
    covers, that part's share, and the run's efficiency at that average; None without overlap."""
    end_s = start_s + duration_s
    found = window_average(log, start_s, end_s)
    if found is None:
        return None
    watts, covered = found
    efficient = watts > 0 and math.isfinite(watts)
    # end_s - start_s, not duration_s: the same rounding as `covered`, so a whole run is 1.0.
    return {"average_w": watts, "covered_share": covered / (end_s - start_s),
            "mb_per_s_per_w": mb_per_s / watts if efficient else None,
            "iops_per_w": iops / watts if efficient else None}


def measure(log: PowerLog, started: str, summary: dict) -> dict | None:
    """run_power of a replayed run: its results' wall-clock start (ISO 8601, the "started" of
    their `run` metadata) and its summary's "tracereplay" section."""
    return run_power(log, parse_when(started), summary["duration_ns"] / 1e9,
                     summary["mb_per_s"], summary["iops"])


def no_overlap(log: PowerLog, first_s: float, last_s: float) -> PowerLogError:
    """The one sentence for a log that covers none of the runs."""
    def at(s):
        return datetime.fromtimestamp(s).astimezone().isoformat(timespec="milliseconds")
    return PowerLogError(
        f"the power log {log.path} runs from {at(log.start_s)} to {at(log.end_s)}, which does not "
        f"overlap the runs, from {at(first_s)} to {at(last_s)}; give the log recorded during the "
        "runs, or its start with --power-start if its times count from the recording's start")
