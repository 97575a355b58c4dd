"""The reviewers' standard tests (`replay bench mix|seqmix|steady|act|pts`): which generators
each runs, running them on the engine, and scoring them into a results set: DIR/results.json
plus one results file per run, exactly as `replay run` writes it.
"""
import json
import math
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from analysis import scoring
from analysis.summary import RunSummary
from replay.errors import ReplayError
from replay.remap import human_bytes
from replay.runner import GeneratorSource, RunOptions, _null_target, replay
from replay.targets import check_safe_to_write, inspect_target
from synth import generators as g

TESTS = ("mix", "seqmix", "steady", "act", "pts")
FORMAT = "tracereplay-results-set"
VERSION = 1
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SECOND_NS = scoring.SECOND_NS

# The reviews' read shares; 70/30 last, as the headline point.
READ_SHARES = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.7)
MIX_SPAN = 8 * GIB
# Run lengths at --scale 1, in seconds: Iometer's 3 minutes a point, an hour of random
# writes scored on its last 400 s in 1-minute rounds, ACT's hour, PTS's 1-minute elements.
MIX_POINT_S = 180.0
STEADY_S = 3600.0
ACT_PERIOD_S = float(scoring.ACT_PERIOD_S)
PTS_ELEMENT_S = 60.0
ROUND_S = 60.0
# SNIA PTS 2.0.2: IOPS test mixes x block sizes, latency test mixes x sizes at QD1.
PTS_READ_SHARES = (1.0, 0.95, 0.65, 0.5, 0.35, 0.05, 0.0)
PTS_BLOCK_SIZES = (512, 4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB, 1024 * KIB)
PTS_LATENCY_READ_SHARES = (1.0, 0.65, 0.0)
PTS_LATENCY_BLOCK_SIZES = (512, 4 * KIB, 8 * KIB)
# A closed-loop stimulus has no natural end: it is run to its time limit.
UNBOUNDED = 1 << 62
# An engine issues discards of up to 4 GiB - 1 (a u32 length): a purge is cut in pieces.
PURGE_PIECE = 1 * GIB


class BenchError(ReplayError):
    """A standard test cannot run as asked; the message says what to change."""


class _Stopped(Exception):
    """A run was interrupted (Ctrl-C): the suite ends, keeping what it has."""


@dataclass
class BenchOptions:
    """The command's options. Durations are seconds at --scale 1 unless given explicitly."""

    scale: float = 1.0
    duration_s: float | None = None  # a point (mix, seqmix), the run (steady, act), an element (pts)
    span: int | None = None  # bytes from offset 0; default 8 GiB for mix, else the target
    engine: str | None = None  # as RunOptions.engine
    destroy_data: bool = False
    seed: int = 0
    window_s: float | None = None  # steady: the scored last window (400 s scaled)
    round_s: float | None = None  # steady: the steady-state round (60 s scaled)
    max_rounds: int = scoring.PTS_MAX_ROUNDS  # pts and steady: rounds before giving up
    multiple: float = 1.0  # act: the load multiple
    search: bool = False  # act: step down from `start` to the highest passing multiple
    start: int = 150
    step: int = 10
    period_s: float | None = None  # act: the scoring period (an hour, scaled)
    block_sizes: tuple | None = None  # pts IOPS test block sizes (bytes)
    fill: bool = True  # mix, seqmix, steady: sequential 128 KiB fill of the span first
    chunk_rows: int = 1 << 16

    def scaled(self, seconds: float, whole: bool = False) -> float:
        """`seconds` at this scale; whole seconds (at least 1) for per-second scoring."""
        value = seconds * self.scale
        return float(max(1, round(value))) if whole else max(value, 0.01)


def _pct(share: float) -> int:
    return int(round(share * 100))


def _size_label(size: int) -> str:
    return f"{size // KIB}k" if size % KIB == 0 else f"{size}b"


def _finite(x):
    """JSON has no infinity: an infinite ratio (a perfectly even run) is stored as null."""
    return x if x is None or math.isfinite(x) else None


class Bench:
    """One `replay bench TEST TARGET -o DIR` invocation. `run()` runs the test and returns the
    results set (also written to DIR/results.json after every run, so a crash or Ctrl-C
    keeps every finished run). `on_run(entry)` is told of each finished run."""

    def __init__(self, test, target, out_dir, options: BenchOptions | None = None,
                 on_run=None, notices=None):
        if test not in TESTS:
            raise BenchError(f"unknown test {test!r}: use one of {', '.join(TESTS)}")
        self.test, self.options = test, options or BenchOptions()
        self.out_dir, self.on_run = Path(out_dir), on_run
        self.notices = [] if notices is None else notices
        o = self.options
        if not (o.scale > 0 and math.isfinite(o.scale)):
            raise BenchError(f"--scale must be a positive number, not {o.scale}")
        for name in ("duration_s", "window_s", "round_s", "period_s"):
            value = getattr(o, name)
            if value is not None and not value > 0:
                raise BenchError(f"--{name[:-2].replace('_', '-')} must be a positive number of "
                                 f"seconds, not {value}")
        if o.max_rounds < 1:
            raise BenchError(f"--max-rounds must be at least 1, not {o.max_rounds}")
        if target is None and o.engine != "null":
            raise BenchError("give a TARGET (a block device or a regular file); only "
                             "--engine null runs without one")
        self.target_arg = None if target is None else str(target)
        default_span = MIX_SPAN if test == "mix" else None
        if self.target_arg is None:
            self.target = _null_target(o.span or MIX_SPAN)
        else:
            self.target = inspect_target(self.target_arg)
        usable = self.target.size // MIB * MIB
        self.span = int(o.span or default_span or usable)
        if self.span <= 0 or self.span % (4 * KIB):
            raise BenchError(f"--span must be a positive multiple of 4 KiB, not {self.span} bytes")
        if self.span > self.target.size:
            raise BenchError(
                f"the {test} test spans {human_bytes(self.span)} ({self.span} bytes) but "
                f"{self.target.path} holds {human_bytes(self.target.size)}; give --span "
                f"{usable} or less, or a larger target")
        if self.target.kind == "block":
            check_safe_to_write(self.target, o.destroy_data)
        self.runs: list[dict] = []
        self.scores: dict = {}
        self.started = datetime.now(timezone.utc).isoformat()

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> dict:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        interrupted = False
        try:
            getattr(self, f"_{self.test}")()
        except (_Stopped, KeyboardInterrupt):
            interrupted = True
        return self._save(interrupted, finished=True)

    def _save(self, interrupted=False, finished=False) -> dict:
        results = {
            "format": FORMAT, "version": VERSION, "test": self.test,
            "target": asdict(self.target), "started": self.started,
            "finished": datetime.now(timezone.utc).isoformat() if finished else None,
            "interrupted": interrupted, "span": self.span,
            "options": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in asdict(self.options).items()},
            "runs": self.runs, "scores": self.scores,
        }
        tmp = self.out_dir / f".results.json.{os.getpid()}.partial"
        tmp.write_text(json.dumps(results, indent=1, allow_nan=False))
        os.replace(tmp, self.out_dir / "results.json")
        return results

    def _replay(self, name, role, generator, *, qd=32, workers=1, afap=True,
                time_limit_s=None, consumers=()):
        """Run one generator on the target into DIR/<name>.parquet and record it."""
        o = self.options
        options = RunOptions(afap=afap, qd=qd, workers=workers, engine=o.engine,
                             destroy_data=True,  # checked once, before the first run
                             time_limit_s=time_limit_s, chunk_rows=o.chunk_rows)
        file = f"{name}.parquet"
        outcome = replay(GeneratorSource(generator, name), self.target_arg, options,
                         output=self.out_dir / file, notices=self.notices, consumers=consumers,
                         metadata={"bench": {"test": self.test, "run": name, "role": role}})
        entry = {
            "name": name, "file": file, "role": role,
            "parameters": {"generator": generator.name, **generator.parameters(),
                           "afap": afap, "qd": qd, "workers": workers,
                           "time_limit_s": time_limit_s},
            "interrupted": outcome.interrupted,
            "summary": outcome.summary.to_dict()["tracereplay"],
        }
        self.runs.append(entry)
        self._save()
        if self.on_run:
            self.on_run(entry)
        if outcome.interrupted:
            raise _Stopped
        return outcome

    def _fill(self, name="fill", passes=1):
        if self.options.fill:
            self._replay(name, "precondition",
                         g.sequential_fill(span=self.span, passes=passes, seed=self.options.seed))

    # ---- the tests ---------------------------------------------------------------------------

    def _mix(self):
        o = self.options
        point_s = o.duration_s or o.scaled(MIX_POINT_S)
        self._fill()
        table = self.scores.setdefault("table", [])
        for share in READ_SHARES:
            for qd, workers in ((3, 1), (32, 1), (1, 32)):
                name = f"r{_pct(share)}-qd{qd}" if workers == 1 else f"r{_pct(share)}-{workers}x1"
                gen = g.random_mix(block_size=4 * KIB, read_share=share, span=self.span,
                                   count=UNBOUNDED, queue_depth=qd * workers, seed=o.seed)
                outcome = self._replay(name, "measure", gen, qd=qd, workers=workers,
                                       time_limit_s=point_s)
                table.append(_table_row(name, share, qd, workers, outcome.summary))
                if share == 0.7 and qd == 32:
                    self.scores["iops_70_30_qd32"] = table[-1]["iops"]

    def _seqmix(self):
        o = self.options
        point_s = o.duration_s or o.scaled(MIX_POINT_S)
        self._fill()
        table = self.scores.setdefault("table", [])
        for share in READ_SHARES:
            name = f"seq-r{_pct(share)}"
            gen = g.sequential_mix(block_size=128 * KIB, read_share=share, span=self.span,
                                   count=UNBOUNDED, queue_depth=1, seed=o.seed)
            outcome = self._replay(name, "measure", gen, qd=1, time_limit_s=point_s)
            table.append(_table_row(name, share, 1, 1, outcome.summary))

    def _steady(self):
        o = self.options
        duration = o.duration_s or o.scaled(STEADY_S, whole=True)
        window = o.window_s or o.scaled(scoring.CONSISTENCY_WINDOW_S, whole=True)
        round_s = o.round_s or o.scaled(ROUND_S, whole=True)
        self._fill()
        bins = scoring.consistency_bins()
        gen = g.random_mix(block_size=4 * KIB, read_share=0.0, span=self.span, count=UNBOUNDED,
                           queue_depth=32, seed=o.seed)
        try:
            self._replay("steady", "measure", gen, qd=32, time_limit_s=duration, consumers=[bins])
        finally:  # an interrupted run is scored up to where it stopped
            stop_ns = int(duration * SECOND_NS) if not self.runs[-1:] or not self.runs[-1]["interrupted"] \
                else None
            self.scores.update(steady_scores(bins, window, round_s, o.max_rounds, stop_ns))

    def _act(self):
        o = self.options
        duration = o.duration_s or o.scaled(ACT_PERIOD_S, whole=True)
        period = o.period_s or o.scaled(ACT_PERIOD_S, whole=True)
        self.scores["periods"] = []

        def attempt(multiple):
            gen = g.act_load(multiple=multiple, span=self.span // (128 * KIB) * (128 * KIB),
                             duration_s=duration, device_block=self.target.logical_block_size,
                             seed=o.seed)
            bins = scoring.act_bins(gen.transaction_max_length)
            # Open loop at the load's own times; an overloaded target falls behind, and what
            # is still unissued well after the end (the grace) fails the run.
            grace = max(5.0, duration / 2)
            try:
                self._replay(f"act-x{multiple:g}", "measure", gen, afap=False, qd=1,
                             time_limit_s=duration + grace, consumers=[bins])
            finally:
                verdict = act_scores(bins, period, duration)
                self.scores["periods"].append({"multiple": multiple, **verdict})
            return verdict["passed"]

        if o.search:
            self.scores["tried"] = []
            search = scoring.act_search(lambda m: self._record_try(m, attempt(m)),
                                        start=o.start, step=o.step)
            self.scores.update(act_multiple=search.score, passed=search.score > 0,
                               at_start=search.at_start)
        else:
            passed = attempt(o.multiple)
            self.scores.update(act_multiple=o.multiple, passed=passed)

    def _record_try(self, multiple, passed):
        self.scores["tried"].append({"multiple": multiple, "passed": passed})
        return passed

    def _pts(self):
        o = self.options
        element_s = o.duration_s or o.scaled(PTS_ELEMENT_S)
        sizes = tuple(o.block_sizes or PTS_BLOCK_SIZES)
        if 4 * KIB not in sizes:
            raise BenchError("the PTS IOPS test tracks 4 KiB random writes: --block-sizes must include 4096")
        if max(sizes) > self.span:
            raise BenchError(f"a block size of {max(sizes)} bytes exceeds the span; give a larger --span")
        pieces = [g.Purge(span=min(PURGE_PIECE, self.span - at), span_start=at, seed=o.seed)
                  for at in range(0, self.span, PURGE_PIECE)]
        fill = g.sequential_fill(span=self.span, passes=2, seed=o.seed)
        self._replay("purge-fill", "precondition", g.Sequence("snia-purge-fill", [*pieces, fill],
                                                              seed=o.seed))
        self.scores["iops_matrix"] = []
        self.scores["latency"] = []

        def iops_element(r, share, size):
            gen = g.random_mix(block_size=size, read_share=share, span=self.span,
                               count=UNBOUNDED, queue_depth=32, seed=o.seed + r)
            name = f"iops-r{r:02d}-rs{_pct(share)}-{_size_label(size)}"
            return self._replay(name, "measure", gen, qd=32, time_limit_s=element_s).summary.iops()

        def latency_element(r, share, size):
            gen = g.random_mix(block_size=size, read_share=share, span=self.span,
                               count=UNBOUNDED, queue_depth=1, seed=o.seed + r)
            name = f"lat-r{r:02d}-rs{_pct(share)}-{_size_label(size)}"
            summary = self._replay(name, "measure", gen, qd=1, time_limit_s=element_s).summary
            clat = summary.to_dict()["tracereplay"]["all"]["clat_ns"]
            return {"mean_ns": clat["mean"], "max_ns": clat["max"],
                    "p99_ns": clat.get("percentile", {}).get("99.000000"), "iops": summary.iops()}

        elements = [(s, b) for s in PTS_READ_SHARES for b in sizes]
        self.scores["iops_steady_state"] = {}
        rounds = _rounds(elements, (0.0, 4 * KIB), iops_element, lambda v: v, o.max_rounds,
                         self.scores["iops_steady_state"])
        for (share, size), values in rounds.items():
            self.scores["iops_matrix"].append({"read_share": share, "block_size": size,
                                               "iops": sum(values) / len(values)})
        self.scores["latency_steady_state"] = {}
        elements = [(s, b) for s in PTS_LATENCY_READ_SHARES for b in PTS_LATENCY_BLOCK_SIZES]
        rounds = _rounds(elements, (0.0, 4 * KIB), latency_element, lambda v: v["mean_ns"],
                         o.max_rounds, self.scores["latency_steady_state"])
        for (share, size), values in rounds.items():
            self.scores["latency"].append({
                "read_share": share, "block_size": size,
                "mean_ns": sum(v["mean_ns"] for v in values) / len(values),
                "max_ns": max(v["max_ns"] for v in values),
                "p99_ns": max((v["p99_ns"] or 0) for v in values),
            })


def _rounds(elements, tracked, measure, value, max_rounds, report):
    """PTS rounds: every element once per round until the tracked element's values are
    steady (or `max_rounds`); returns each element's results over the measurement window
    (the steady window, else the last PTS_WINDOW rounds). `report` gets the check."""
    results = {e: [] for e in elements}
    check = None
    for r in range(1, max_rounds + 1):
        for share, size in elements:
            results[(share, size)].append(measure(r, share, size))
        check = scoring.steady_state([value(v) for v in results[tracked]], max_rounds=max_rounds)
        report.update(_steady_report(check))
        if check.steady:
            break
    window = scoring.PTS_WINDOW
    return {e: v[-window:] for e, v in results.items()}


def _steady_report(check) -> dict:
    return {"reached": check.steady, "round": check.steady_round, "status": check.status,
            "rounds": [{**asdict(c), "window": list(c.window) if c.window else None}
                       for c in check.rounds]}


def _table_row(name, share, qd, workers, summary: RunSummary) -> dict:
    t = summary.to_dict()["tracereplay"]
    return {"run": name, "read_share": share, "qd": qd, "workers": workers, "iops": t["iops"],
            "mb_per_s": t["mb_per_s"],
            "p99_ns": t["all"]["clat_ns"].get("percentile", {}).get("99.000000")}


def steady_scores(bins, window_s, round_s, max_rounds, duration_ns) -> dict:
    """The steady test's scores from its per-second bins (scoring.consistency_bins):
    consistency of the last `window_s` seconds, and PTS steady state over rounds of
    `round_s` seconds. `duration_ns` None (an interrupted run) scores up to the last I/O."""
    c = scoring.consistency(bins, window_s=int(window_s), duration_ns=duration_ns)
    series = bins.rate(duration_ns)
    rounds = scoring.round_averages(series, max(1, int(round(round_s))))
    check = scoring.steady_state(rounds, max_rounds=max_rounds)
    return {
        "steady_iops": c.average_iops, "consistency": _finite(c.consistency),
        "stddev_iops": c.stddev_iops, "window_s": c.seconds, "short_window": c.short,
        "slow_share": c.slow_share, "slow_ns": c.slow_ns,
        "steady_state": _steady_report(check), "iops_series": [float(x) for x in series],
    }


def act_scores(bins, period_s, duration_s) -> dict:
    """One ACT run's verdict: scoring.act_check over its periods, and no transaction left
    unissued (an overloaded target that never got to them fails)."""
    check = scoring.act_check(bins, period_s=period_s, duration_ns=int(duration_s * SECOND_NS))
    reason = check.reason
    if bins.not_issued and check.passed:
        reason = f"{bins.not_issued} transactions were never issued: the target fell behind"
    return {"passed": check.passed and not bins.not_issued, "reason": reason,
            "not_issued": bins.not_issued,
            "periods": [{**asdict(p), "shares": [_finite(s) if not math.isnan(s) else None
                                                 for s in p.shares]} for p in check.periods]}


def format_results(results: dict) -> str:
    """A compact table of a results set's scores, for the console."""
    s, lines = results["scores"], []
    test = results["test"]
    if test in ("mix", "seqmix"):
        lines.append(f"{'run':<12}{'read %':>7}{'QD':>4}{'workers':>8}{'IOPS':>12}{'MB/s':>10}{'p99 ms':>9}")
        for row in s.get("table", []):
            p99 = "-" if row["p99_ns"] is None else f"{row['p99_ns'] / 1e6:.2f}"
            lines.append(f"{row['run']:<12}{_pct(row['read_share']):>7}{row['qd']:>4}{row['workers']:>8}"
                         f"{row['iops']:>12,.0f}{row['mb_per_s']:>10.1f}{p99:>9}")
        if "iops_70_30_qd32" in s:
            lines.append(f"headline: 70/30 at QD32: {s['iops_70_30_qd32']:,.0f} IOPS")
    elif test == "steady":
        ss = s.get("steady_state", {})
        if s.get("steady_iops") is not None:
            c = s.get("consistency")
            lines.append(f"steady IOPS (last {s['window_s']} s): {s['steady_iops']:,.0f}; "
                         f"consistency (average / stddev): {'inf' if c is None else f'{c:.1f}'}")
        lines.append(f"SNIA steady state: {'reached at round ' + str(ss.get('round')) if ss.get('reached') else ss.get('status', '-')}"
                     f" ({len(ss.get('rounds', []))} rounds)")
    elif test == "act":
        for p in s.get("periods", []):
            lines.append(f"x{p['multiple']:g}: {'pass' if p['passed'] else 'FAIL'}"
                         + (f" ({p['reason']})" if p["reason"] else ""))
        if "act_multiple" in s:
            lines.append(f"ACT score: {s['act_multiple']:g}x ({'passed' if s['passed'] else 'failed'})")
    elif test == "pts":
        lines.append(f"{'read %':>7}{'block':>8}{'IOPS':>12}")
        for row in s.get("iops_matrix", []):
            lines.append(f"{_pct(row['read_share']):>7}{_size_label(row['block_size']):>8}{row['iops']:>12,.0f}")
        ss = s.get("iops_steady_state", {})
        lines.append(f"steady state (4 KiB random writes): "
                     f"{'round ' + str(ss.get('round')) if ss.get('reached') else ss.get('status', '-')}")
        lines.append(f"{'read %':>7}{'block':>8}{'mean us':>10}{'max us':>10}")
        for row in s.get("latency", []):
            lines.append(f"{_pct(row['read_share']):>7}{_size_label(row['block_size']):>8}"
                         f"{row['mean_ns'] / 1e3:>10.1f}{row['max_ns'] / 1e3:>10.1f}")
    return "\n".join(lines)


def run_bench(test, target, out_dir, options: BenchOptions | None = None, on_run=None,
              notices=None) -> dict:
    """Run standard test `test` on `target` (None with the null engine) into `out_dir`."""
    return Bench(test, target, out_dir, options, on_run, notices).run()
