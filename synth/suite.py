"""The reviewers' standard tests (`replay bench mix|seqmix|steady|act|pts`): which generators
each runs, running them on the engine, and scoring them into a results set: DIR/results.json
plus one results file per run, exactly as `replay run` writes it.
"""
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from analysis import scoring
from analysis.summary import RunSummary
from replay.remap import human_bytes
from replay.runner import GeneratorSource, RunOptions, _null_target, replay
from synth import generators as g
from traces.errors import ReplayError
from traces.targets import check_safe_to_write, inspect_target
from traces.trace import open_trace

TESTS = ("mix", "seqmix", "steady", "act", "pts")
FORMAT = "tracereplay-results-set"
VERSION = 1
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SECOND_NS = scoring.SECOND_NS

# The reviews' read shares; 70/30 last, as the headline point. SIX_SHARES are seed 001's
# and 002's sweeps ("starting at 100 % reads and adding 20 % of writes in each phase"), whose
# average MB/s is seed 001's bar.
READ_SHARES = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.7)
SIX_SHARES = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
MIX_SPAN = 8 * GIB
# Queue-depth splits as (workers, queue depth each): 1x3 is Iometer's QD3 (seeds 001, 004),
# 1x32 one worker at QD32 (seeds 002, 004), 32x1 seed 000's "QD32" (32 threads at QD1).
# `mix` runs each split's whole sweep before the next (queue depth outermost), refilling the
# target before each, so no split inherits the state another split's writes left.
MIX_SPLITS = ((1, 3), (1, 32), (32, 1))
FILL_BLOCK = 128 * KIB
DATA_PATTERN = r"random|zeros|compressible:(\d{1,2}|100)"
# Run lengths at --scale 1, in seconds: Iometer's 3 minutes a point, an hour of random
# writes scored on its last 400 s in 1-minute rounds, ACT's hour, PTS's 1-minute elements.
MIX_POINT_S = 180.0
STEADY_S = 3600.0
# Seed 002's 70/30 steady state: 2 h of sequential writes, 6 h of 4 KiB 70/30 at QD32 scored
# on the last 500 s, then QD scaling (QD1 to QD32) and the six-mix sweep at QD32.
STEADY_70_30_PRECONDITION_S = 7200.0
STEADY_70_30_S = 21600.0
STEADY_70_30_WINDOW_S = 500.0
QD_SCALING = (1, 2, 4, 8, 16, 32)
ACT_PERIOD_S = float(scoring.ACT_PERIOD_S)
PTS_ELEMENT_S = 60.0
ROUND_S = 60.0
# SNIA PTS 2.0.2: IOPS test mixes x block sizes, latency test mixes x sizes at QD1.
PTS_READ_SHARES = (1.0, 0.95, 0.65, 0.5, 0.35, 0.05, 0.0)
PTS_BLOCK_SIZES = (512, 4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB, 1024 * KIB)
PTS_LATENCY_READ_SHARES = (1.0, 0.65, 0.0)
PTS_LATENCY_BLOCK_SIZES = (512, 4 * KIB, 8 * KIB)
# The mix score `replay verdict` sets beside real use: seed 000's 70/30 "QD32", 32 workers
# at QD1 (analysis.verdict.SYNTHETIC_SCORES reads it).
VERDICT_MIX_KEY = "iops_70_30_32x1"
# A closed-loop stimulus has no natural end: it is an unbounded generator run to its time
# limit. UNBOUNDED is a count no run reaches, for callers that need a finite one.
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
    span: int | str | None = None  # bytes from offset 0, or "target"; default 8 GiB for mix, else the target
    engine: str | None = None  # as RunOptions.engine
    destroy_data: bool = False
    seed: int = 0
    window_s: float | None = None  # steady: the scored last window (400 s scaled)
    round_s: float | None = None  # steady: the steady-state round (60 s scaled)
    max_rounds: int = scoring.PTS_MAX_ROUNDS  # pts: rounds before giving up (steady checks all)
    multiple: float = 1.0  # act: the load multiple
    search: bool = False  # act: step down from `start` to the highest passing multiple
    start: int = 150
    step: int = 10
    period_s: float | None = None  # act: the scoring period (an hour, scaled)
    block_sizes: tuple | None = None  # pts IOPS test block sizes (bytes)
    fill: bool = True  # mix, seqmix, steady: sequential 128 KiB fill first
    fill_bytes: int | None = None  # bytes filled from offset 0; None: the whole target
    qd_splits: tuple | None = None  # mix: (workers, qd) splits, outermost; default MIX_SPLITS
    read_shares: tuple | None = None  # mix, seqmix: the sweep (default READ_SHARES); steady: the
    # QD32 sweep after the steady run and its QD scaling (seed 002: the six; default none)
    data: tuple = ("random",)  # what measured writes carry (replay run --data); mix: each in turn
    sweeps: tuple | None = None  # mix: explicit (split, shares, data) sweeps (presets)
    read_share: float = 0.0  # steady: reads in the measured mix (seed 002: 0.7)
    precondition_s: float | None = None  # steady: seconds of sequential writes (>= one fill)
    point_s: float | None = None  # steady: seconds per QD-scaling and sweep point (180 scaled)
    qd_scaling: tuple = ()  # steady: queue depths run after the steady run (seed 002: 1..32)
    chunk_rows: int = 1 << 16
    act_prep: bool = True  # act: act_prep (zeros, then random data over the whole target) first
    act_latency: str = "intended"  # act: scoring.ACT_LATENCY key; "issue" is ACT 6's

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
        for name in ("duration_s", "window_s", "round_s", "period_s", "precondition_s", "point_s"):
            value = getattr(o, name)
            if value is not None and not value > 0:
                raise BenchError(f"--{name[:-2].replace('_', '-')} must be a positive number of "
                                 f"seconds, not {value}")
        if not 0.0 <= o.read_share <= 1.0:
            raise BenchError(f"--read-share must be from 0 to 100 percent, not {o.read_share * 100:g}")
        if any(q < 1 for q in o.qd_scaling):
            raise BenchError(f"--qd-scaling needs queue depths of at least 1, not {o.qd_scaling}")
        if o.act_latency not in scoring.ACT_LATENCY:
            raise BenchError(f"--act-latency must be intended (the queue-era ACT) or issue "
                             f"(ACT 6), not {o.act_latency!r}")
        if o.max_rounds < 1:
            raise BenchError(f"--max-rounds must be at least 1, not {o.max_rounds}")
        if target is None and o.engine != "null":
            raise BenchError("give a TARGET (a block device or a regular file); only "
                             "--engine null runs without one")
        self.target_arg = None if target is None else str(target)
        default_span = MIX_SPAN if test == "mix" else None
        if self.target_arg is None:
            null_span = MIX_SPAN if o.span in (None, "target") else o.span
            self.target = _null_target(max(null_span, o.fill_bytes or 0))
        else:
            self.target = inspect_target(self.target_arg)
        usable = self.target.size // MIB * MIB
        self.span = usable if o.span == "target" else int(o.span or default_span or usable)
        if o.fill_bytes is not None and not 0 < o.fill_bytes <= self.target.size:
            raise BenchError(f"--fill must be between 1 byte and the target's "
                             f"{self.target.size} bytes, not {o.fill_bytes}")
        if isinstance(o.data, str):
            o.data = tuple(o.data.split(","))
        for pattern in o.data:
            if not re.fullmatch(DATA_PATTERN, pattern):
                raise BenchError(f"--data {pattern!r} is not a data pattern: use random, zeros "
                                 "or compressible:PCT with PCT from 0 to 100")
        for w, q in o.qd_splits or ():
            if w < 1 or q < 1:
                raise BenchError(f"a queue-depth split needs at least 1 worker at QD1, not {w}x{q}")
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
        self.preset = None  # set by run_bench for a seed preset: its name, seed and overrides

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
            "interrupted": interrupted, "span": self.span, "preset": self.preset,
            "options": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in asdict(self.options).items()},
            "runs": self.runs, "scores": self.scores,
        }
        tmp = self.out_dir / f".results.json.{os.getpid()}.partial"
        tmp.write_text(json.dumps(results, indent=1, allow_nan=False))
        os.replace(tmp, self.out_dir / "results.json")
        return results

    def _replay(self, name, role, generator, *, qd=32, workers=1, afap=True,
                time_limit_s=None, consumers=(), data="random"):
        """Run one generator on the target into DIR/<name>.parquet and record it. A run that
        ACT gave up on (scoring.ActGaveUp from a consumer) is recorded, then re-raised."""
        o = self.options
        # An open-loop run hands its results over in smaller chunks, so that a consumer
        # watching it (ACT's early stop) hears of a backlog within seconds.
        chunk_rows = o.chunk_rows if afap else min(o.chunk_rows, 4096)
        options = RunOptions(afap=afap, qd=qd, workers=workers, engine=o.engine,
                             destroy_data=True,  # checked once, before the first run
                             time_limit_s=time_limit_s, chunk_rows=chunk_rows, data=data)
        file = f"{name}.parquet"
        parameters = {"generator": generator.name, **generator.parameters(), "afap": afap,
                      "qd": qd, "workers": workers, "time_limit_s": time_limit_s, "data": data}
        try:
            outcome = replay(GeneratorSource(generator, name), self.target_arg, options,
                             output=self.out_dir / file, notices=self.notices, consumers=consumers,
                             metadata={"bench": {"test": self.test, "run": name, "role": role}})
        except scoring.ActGaveUp as e:
            md = open_trace(self.out_dir / file).metadata  # closed by the runner, rows kept
            self.runs.append({"name": name, "file": file, "role": role, "parameters": parameters,
                              "interrupted": False, "gave_up": str(e),
                              "summary": md["summary"]["tracereplay"]})
            self._save()
            if self.on_run:
                self.on_run(self.runs[-1])
            raise
        entry = {
            "name": name, "file": file, "role": role, "parameters": parameters,
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

    @property
    def fill_span(self) -> int:
        """Bytes a fill writes from offset 0: the whole target unless --fill says less. The
        reviews fill the drive, not the span they test: the unwritten rest would otherwise
        act as spare area and raise every write-bearing point."""
        return int(self.options.fill_bytes or self.target.size)

    def _fill(self, name="fill", passes=1, data="random"):
        if self.options.fill:
            self._replay(name, "precondition",
                         g.sequential_fill(span=self.fill_span, passes=passes,
                                           block_size=FILL_BLOCK, seed=self.options.seed),
                         data=data)

    # ---- the tests ---------------------------------------------------------------------------

    def mix_sweeps(self) -> list:
        """(split, read shares, data pattern) per sweep, in the order run: queue-depth split
        outermost, then data pattern, then read share."""
        o = self.options
        if o.sweeps:
            return [(tuple(split), tuple(shares), data) for split, shares, data in o.sweeps]
        shares = tuple(o.read_shares or READ_SHARES)
        return [(tuple(split), shares, data) for split in (o.qd_splits or MIX_SPLITS)
                for data in o.data]

    def _mix(self):
        o = self.options
        point_s = o.duration_s or o.scaled(MIX_POINT_S)
        table = self.scores.setdefault("table", [])
        sweeps = self.mix_sweeps()
        for i, ((workers, qd), shares, data) in enumerate(sweeps):
            key = _sweep_key((workers, qd), data)
            self._fill(f"fill{i + 1}-{key}" if len(sweeps) > 1 else "fill")  # before each sweep
            rows = []
            for share in shares:
                name = f"{key}-r{_pct(share)}"
                gen = g.random_mix(block_size=4 * KIB, read_share=share, span=self.span,
                                   unbounded=True, queue_depth=qd * workers, seed=o.seed)
                outcome = self._replay(name, "measure", gen, qd=qd, workers=workers,
                                       time_limit_s=point_s, data=data)
                rows.append(_table_row(name, share, qd, workers, outcome.summary, data))
                table.append(rows[-1])
                self._sweep_scores(key, rows, len(shares))

    def _sweep_scores(self, key, rows, planned=None):
        """Score keys name the split (and a data pattern other than random): iops_70_30_1x32
        is one worker at QD32, iops_70_30_32x1 32 workers at QD1 (seed 000's "QD32")."""
        for row in rows:
            if row["read_share"] == 0.7:
                self.scores[f"iops_70_30_{key}"] = row["iops"]
                self.scores[f"mb_per_s_70_30_{key}"] = row["mb_per_s"]
        if (planned or len(rows)) < len(SIX_SHARES):  # single points (seed 004's) are scores
            for row in rows:
                self.scores[f"mb_per_s_r{_pct(row['read_share'])}_{key}"] = row["mb_per_s"]
        six = [r["mb_per_s"] for r in rows if r["read_share"] in SIX_SHARES]
        if len(six) == len(SIX_SHARES):  # seed 001's bar: the average of the six mixes
            self.scores[f"mb_per_s_average_{key}"] = sum(six) / len(six)

    def _seqmix(self):
        o = self.options
        point_s = o.duration_s or o.scaled(MIX_POINT_S)
        self._fill()
        table = self.scores.setdefault("table", [])
        data = o.data[0]
        for share in tuple(o.read_shares or READ_SHARES):
            name = f"seq-r{_pct(share)}"
            gen = g.sequential_mix(block_size=128 * KIB, read_share=share, span=self.span,
                                   unbounded=True, queue_depth=1, seed=o.seed)
            outcome = self._replay(name, "measure", gen, qd=1, time_limit_s=point_s, data=data)
            table.append(_table_row(name, share, 1, 1, outcome.summary, data))
        self._sweep_scores("1x1", table)

    def _precondition(self):
        """One sequential fill of the target, then, with --precondition S, more sequential
        writes wrapping round it until S seconds of them have run in all (seed 002: 2 h)."""
        o = self.options
        if not o.fill:
            return
        self._fill()
        if o.precondition_s is None:
            return
        total = o.precondition_s
        done = self.runs[-1]["summary"]["duration_ns"] / SECOND_NS if self.runs else 0.0
        if total > done:
            gen = g.sequential_mix(block_size=FILL_BLOCK, read_share=0.0, span=self.fill_span,
                                   align=math.gcd(FILL_BLOCK, self.fill_span, 4096),
                                   unbounded=True, queue_depth=32, seed=o.seed)
            self._replay("precondition", "precondition", gen, qd=32, time_limit_s=total - done)

    def _steady(self):
        o = self.options
        duration = o.duration_s or o.scaled(STEADY_S, whole=True)
        window = o.window_s or o.scaled(scoring.CONSISTENCY_WINDOW_S, whole=True)
        round_s = o.round_s or o.scaled(ROUND_S, whole=True)
        self._precondition()
        bins = scoring.consistency_bins()
        gen = g.random_mix(block_size=4 * KIB, read_share=o.read_share, span=self.span,
                           unbounded=True, queue_depth=32, seed=o.seed)
        self.scores["read_share"] = o.read_share
        try:
            self._replay("steady", "measure", gen, qd=32, time_limit_s=duration, consumers=[bins],
                         data=o.data[0])
        finally:  # an interrupted run is scored up to where it stopped
            stop_ns = int(duration * SECOND_NS) if not self.runs[-1:] or not self.runs[-1]["interrupted"] \
                else None
            self.scores.update(steady_scores(bins, window, round_s, None, stop_ns))
        point_s = o.point_s or o.scaled(MIX_POINT_S)
        if o.qd_scaling:  # seed 002: queue-depth scaling on the drive as the 6 h left it
            rows = self.scores["qd_scaling"] = []
            for qd in o.qd_scaling:
                gen = g.random_mix(block_size=4 * KIB, read_share=o.read_share, span=self.span,
                                   unbounded=True, queue_depth=qd, seed=o.seed)
                name = f"qd{qd}-r{_pct(o.read_share)}"
                outcome = self._replay(name, "measure", gen, qd=qd, time_limit_s=point_s,
                                       data=o.data[0])
                rows.append(_table_row(name, o.read_share, qd, 1, outcome.summary, o.data[0]))
        if o.read_shares:  # then the read-share sweep at QD32
            rows = self.scores["table"] = []
            for share in o.read_shares:
                gen = g.random_mix(block_size=4 * KIB, read_share=share, span=self.span,
                                   unbounded=True, queue_depth=32, seed=o.seed)
                name = f"1x32-r{_pct(share)}"
                outcome = self._replay(name, "measure", gen, qd=32, time_limit_s=point_s,
                                       data=o.data[0])
                rows.append(_table_row(name, share, 32, 1, outcome.summary, o.data[0]))
            self._sweep_scores("1x32", rows)

    def _act(self):
        o = self.options
        duration = o.duration_s or o.scaled(ACT_PERIOD_S, whole=True)
        period = o.period_s or o.scaled(ACT_PERIOD_S, whole=True)
        self.scores["periods"] = []

        span = self.span // (128 * KIB) * (128 * KIB)
        self.scores["latency_definition"] = scoring.ACT_LATENCY[o.act_latency]
        if o.act_prep:  # act_prep: zeros over the whole device, then random data, once
            for data in ("zeros", "random"):
                self._replay(f"act-prep-{data}", "precondition",
                             g.sequential_fill(span=self.fill_span, block_size=FILL_BLOCK,
                                               seed=o.seed), data=data)

        def attempt(multiple):
            gen = g.act_load(multiple=multiple, span=span, duration_s=duration,
                             device_block=self.target.logical_block_size, seed=o.seed)
            bins = scoring.act_bins(gen.transaction_max_length, latency_from=o.act_latency)
            late = scoring.act_bins(gen.transaction_max_length, latency_from="lateness")
            watch = scoring.ActWatch(gen.rate, gen.transaction_max_length)
            # Open loop at the load's own times; an overloaded target falls behind, and what
            # is still unissued well after the end (the grace) fails the run, unless ACT's
            # own early stop (ActWatch) gave up on it first.
            grace = max(5.0, duration / 2)
            gave_up = None
            try:
                self._replay(f"act-x{multiple:g}", "measure", gen, afap=False, qd=1,
                             time_limit_s=duration + grace, consumers=[bins, late, watch])
            except scoring.ActGaveUp as e:
                gave_up = str(e)
            finally:
                verdict = act_scores(bins, period, duration)
                if gave_up:
                    verdict.update(passed=False, reason=f"ACT gave up: {gave_up}")
                lateness = lateness_report(late, period, duration)
                if lateness["warning"]:
                    self.notices.append(f"x{multiple:g}: {lateness['warning']}")
                self.scores["periods"].append({"multiple": multiple, **verdict,
                                               "gave_up": gave_up, "lateness": lateness})
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
        self.scores["purge"] = purge_statement(self.target)

        def purge_fill(name):
            """PTS's purge (a discard of the span, see purge_statement) and its
            workload-independent preconditioning, twice the span in 128 KiB sequential writes."""
            pieces = [g.Purge(span=min(PURGE_PIECE, self.span - at), span_start=at, seed=o.seed)
                      for at in range(0, self.span, PURGE_PIECE)]
            fill = g.sequential_fill(span=self.span, passes=2, seed=o.seed)
            self._replay(name, "precondition", g.Sequence("snia-purge-fill", [*pieces, fill],
                                                          seed=o.seed))

        purge_fill("purge-fill")
        self.scores["iops_matrix"] = []
        self.scores["latency"] = []

        def iops_element(r, share, size):
            gen = g.random_mix(block_size=size, read_share=share, span=self.span,
                               unbounded=True, queue_depth=32, seed=o.seed + r)
            name = f"iops-r{r:02d}-rs{_pct(share)}-{_size_label(size)}"
            return self._replay(name, "measure", gen, qd=32, time_limit_s=element_s).summary.iops()

        def latency_element(r, share, size):
            gen = g.random_mix(block_size=size, read_share=share, span=self.span,
                               unbounded=True, queue_depth=1, seed=o.seed + r)
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
        # The latency test is a test of its own in PTS: purged and preconditioned afresh, not
        # run on the drive as the IOPS test's rounds left it.
        purge_fill("lat-purge-fill")
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


def purge_statement(target) -> dict:
    """Whether the discard this suite purges with is a PTS purge on `target`, and what to do
    where it is not. PTS 2.0.2 asks for a purge that returns the drive to its fresh-out-of-box
    state: ATA SECURITY ERASE or SANITIZE, SCSI FORMAT UNIT or SANITIZE, NVMe Format or
    Sanitize. A discard (TRIM, UNMAP, Deallocate) only unmaps LBAs, and the drive keeps its
    mapping and its NAND's state, so on an SSD it is not one."""
    what = {"method": "discard of the span"}
    if target.kind == "null":
        return {**what, "pts_purge": None, "why": "the null engine does no I/O"}
    if target.kind == "file" or target.backing_file:
        return {**what, "pts_purge": True,
                "why": "on a regular file (or a loop device over one) a discard punches holes: "
                       "the blocks are freed and read back as zeros, the file's own fresh state"}
    return {**what, "pts_purge": False,
            "why": f"{target.path} is a drive: a discard only unmaps its LBAs, not the purge PTS "
                   "requires; purge it with the drive's own command first (nvme format or nvme "
                   "sanitize; hdparm --security-erase or sg_sanitize for SATA and SAS), and read "
                   "these results as preconditioned, not purged, where that was not done"}


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


def split_label(split) -> str:
    """(workers, qd) -> "WORKERSxQD": "1x32" is one worker at QD32, "32x1" 32 workers at QD1."""
    return f"{split[0]}x{split[1]}"


def parse_split(text: str) -> tuple:
    """"32" (one worker at QD32), "1x32" or "32x1" (WORKERSxQD) -> (workers, qd)."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*x\s*)?(\d+)\s*", str(text).lower())
    if not m or int(m.group(2)) < 1 or (m.group(1) is not None and int(m.group(1)) < 1):
        raise BenchError(f"{text!r} is not a queue-depth split: give QD (one worker) or "
                         "WORKERSxQD, for example 3, 1x32 or 32x1")
    return (int(m.group(1) or 1), int(m.group(2)))


def _data_label(data: str) -> str:
    return "" if data == "random" else "_" + data.replace(":", "")


def _sweep_key(split, data="random") -> str:
    return split_label(split) + _data_label(data)


def _table_row(name, share, qd, workers, summary: RunSummary, data="random") -> dict:
    t = summary.to_dict()["tracereplay"]
    return {"run": name, "read_share": share, "qd": qd, "workers": workers,
            "split": split_label((workers, qd)), "data": data, "iops": t["iops"],
            "mb_per_s": t["mb_per_s"],
            "p99_ns": t["all"]["clat_ns"].get("percentile", {}).get("99.000000")}


def steady_scores(bins, window_s, round_s, max_rounds, duration_ns) -> dict:
    """The steady test's scores from its per-second bins (scoring.consistency_bins):
    consistency of the last `window_s` seconds, and PTS steady state over rounds of
    `round_s` seconds: over every round of the run when `max_rounds` is None (the run's
    length is set; the check reports the first steady window and whether the last five
    rounds, the state the scored window comes from, are steady). `duration_ns` None (an
    interrupted run) scores up to the last I/O."""
    c = scoring.consistency(bins, window_s=int(window_s), duration_ns=duration_ns)
    series = bins.rate(duration_ns)
    rounds = scoring.round_averages(series, max(1, int(round(round_s))))
    check = scoring.steady_state(rounds, max_rounds=max_rounds or max(1, len(rounds)))
    last = scoring.steady_state(rounds[-scoring.PTS_WINDOW:], max_rounds=scoring.PTS_WINDOW)
    return {
        "steady_iops": c.average_iops, "consistency": _finite(c.consistency),
        "stddev_iops": c.stddev_iops, "window_s": c.seconds, "short_window": c.short,
        "slow_share": c.slow_share, "slow_share_run": c.slow_share_run, "slow_ns": c.slow_ns,
        "steady_state": _steady_report(check), "round_iops": [float(x) for x in rounds],
        "round_s": max(1, int(round(round_s))), "last_rounds_steady": last.steady,
        "iops_series": [float(x) for x in series],
    }


# The replayer's own lateness is worth a warning once it alone takes this share of a limit.
LATENESS_WARN = 0.1


def lateness_report(bins, period_s, duration_s) -> dict:
    """The replayer's own lateness beside an ACT verdict: per limit, the worst whole period's
    share of transactions issued later than the limit's latency (bins of act_bins(...,
    latency_from="lateness")), what part of the limit's allowance that is, and a warning
    when it reaches LATENESS_WARN of one. That much of the budget is spent before the drive
    sees the I/O: on a drive that keeps up, by the host's scheduling (the null engine at 1x
    measures it alone); on one that falls behind, also by waiting for a free in-flight slot."""
    periods = [p for p in scoring.qos(bins, period_s=period_s,
                                      duration_ns=int(duration_s * SECOND_NS))
               if p.seconds >= period_s]
    rows = []
    for threshold, limit in scoring.ACT_LIMITS:
        shares = [p.shares[int(threshold)] for p in periods if p.shares[int(threshold)] is not None]
        worst = max(shares) if shares else None
        rows.append({"over_ns": int(threshold), "limit": limit, "share": worst,
                     "of_limit": None if worst is None else worst / limit})
    worst = max((r for r in rows if r["of_limit"] is not None), key=lambda r: r["of_limit"],
                default=None)
    warning = None
    if worst and worst["of_limit"] >= LATENESS_WARN:
        warning = (f"the replayer itself issued {worst['share']:.2%} of transactions more than "
                   f"{worst['over_ns'] / 1e6:g} ms after they were due, {worst['of_limit']:.0%} of "
                   f"ACT's {worst['limit']:.1%} allowance spent before the drive saw them (host "
                   "scheduling, or the replayer's in-flight limit once the drive falls behind)")
    return {"limits": rows, "warning": warning}


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
        lines.append(f"{'run':<26}{'read %':>7}{'workers x QD':>13}{'IOPS':>12}{'MB/s':>10}{'p99 ms':>9}")
        for row in s.get("table", []):
            p99 = "-" if row["p99_ns"] is None else f"{row['p99_ns'] / 1e6:.2f}"
            split = f"{row['workers']} x {row['qd']}"
            lines.append(f"{row['run']:<26}{_pct(row['read_share']):>7}{split:>13}"
                         f"{row['iops']:>12,.0f}{row['mb_per_s']:>10.1f}{p99:>9}")
        for key, value in s.items():
            if key.startswith("iops_70_30_"):
                w, q = key[len("iops_70_30_"):].split("_")[0].split("x")
                data = key.split("_", 4)[4] if key.count("_") > 3 else ""
                lines.append(f"70/30 at {w} worker(s) x QD{q}{' ' + data if data else ''}: "
                             f"{value:,.0f} IOPS" + (" (the verdict's mix score)"
                                                     if key == VERDICT_MIX_KEY else ""))
            elif key.startswith("mb_per_s_r"):
                pct, sweep = key[len("mb_per_s_r"):].split("_", 1)
                lines.append(f"{pct} % reads at {sweep}: {value:,.1f} MB/s")
            elif key.startswith("mb_per_s_average_"):
                lines.append(f"average of the six mixes, {key[len('mb_per_s_average_'):]}: "
                             f"{value:,.1f} MB/s")
    elif test == "steady":
        ss = s.get("steady_state", {})
        if s.get("steady_iops") is not None:
            c = s.get("consistency")
            lines.append(f"steady IOPS (last {s['window_s']} s): {s['steady_iops']:,.0f}; "
                         f"consistency (average / stddev): {'inf' if c is None else f'{c:.1f}'}")
        if s.get("slow_share") is not None:
            lines.append(f"I/Os over {s['slow_ns'] / 1e6:g} ms in the last {s['window_s']} s: "
                         f"{s['slow_share']:.3%}")
        lines.append(f"SNIA steady state: {'reached at round ' + str(ss.get('round')) if ss.get('reached') else ss.get('status', '-')}"
                     f" (checked over {len(s.get('round_iops', ss.get('rounds', [])))} rounds; the last "
                     f"{scoring.PTS_WINDOW} {'are' if s.get('last_rounds_steady') else 'are not'} steady)")
        for title, key in (("QD scaling", "qd_scaling"), ("read-share sweep", "table")):
            if s.get(key):
                lines.append(f"{title}: " + ", ".join(
                    f"{'QD' + str(r['qd']) if key == 'qd_scaling' else str(_pct(r['read_share'])) + ' % reads'}"
                    f" {r['iops']:,.0f} IOPS" for r in s[key]))
    elif test == "act":
        if s.get("latency_definition"):
            lines.append(f"latency: {s['latency_definition']}")
        for p in s.get("periods", []):
            late = (p.get("lateness") or {}).get("limits") or []
            own = ", ".join(f"{r['share']:.3%} over {r['over_ns'] / 1e6:g} ms" for r in late
                            if r["share"] is not None)
            lines.append(f"x{p['multiple']:g}: {'pass' if p['passed'] else 'FAIL'}"
                         + (f" ({p['reason']})" if p["reason"] else "")
                         + (f"; replayer lateness alone: {own}" if own else ""))
            if (p.get("lateness") or {}).get("warning"):
                lines.append(f"  warning: {p['lateness']['warning']}")
        if "act_multiple" in s:
            lines.append(f"ACT score: {s['act_multiple']:g}x ({'passed' if s['passed'] else 'failed'})")
    elif test == "pts":
        if s.get("purge"):
            lines.append(f"purge: {s['purge']['method']}; a PTS purge here: "
                         f"{ {True: 'yes', False: 'no', None: 'n/a'}[s['purge']['pts_purge']] } "
                         f"({s['purge']['why']})")
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


# ---- one preset per seed test ---------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """One review's test as the review ran it. `options` are BenchOptions fields; durations
    (fields ending _s) are seconds at --scale 1 and scale like the tests' own defaults."""

    name: str
    test: str
    seed: str  # the review page in seeds/ it reproduces
    review: str
    summary: str
    options: dict
    unstated: str = ""  # what the seed does not say, and what the preset uses there


SEED_000 = "000_e00a9c71e8fcdb9d"
SEED_001 = "001_983fe9c54fc70624"
SEED_002 = "002_f8f564417faab2c2"
SEED_003 = "003_80e9a2349c555c4f"
SEED_004 = "004_c4e9fb97af32afe1"
# Iometer's "pseudo-random" data is compressible; the seed gives no ratio, and the engine's
# nearest pattern is half of every 4 KiB zeros.
PSEUDO_RANDOM = "compressible:50"

PRESETS = {p.name: p for p in (
    Preset("seed000-mix", "mix", SEED_000, "AnandTech, Kingston DC500 (2019): mixed random",
           "4 KiB random read shares 100/80/60/40/20/0 and 70/30 at QD32 as 32 workers x QD1, "
           "over the whole target after a whole-target 128 KiB sequential fill; headline 70/30",
           {"sweeps": (((32, 1), READ_SHARES, "random"),), "span": "target",
            "duration_s": MIX_POINT_S},
           "the shares graphed, the span, a fill and the point length: the six shares plus "
           "70/30, the whole target, a whole-target fill, 3 min a point"),
    Preset("seed000-act", "act", SEED_000, "AnandTech, Kingston DC500 (2019): Aerospike ACT",
           "act_prep, then ACT from 150x stepping down by 10x until a full hour passes the "
           "1/8/64 ms limits, then narrowed; latency from the due time (the queue-era ACT)",
           {"search": True, "start": 150, "step": 10, "duration_s": ACT_PERIOD_S,
            "period_s": ACT_PERIOD_S}),
    Preset("seed001-mix", "mix", SEED_001, "AnandTech, Samsung SM951 (2015): mixed random",
           "whole-target 128 KiB sequential fill, then 4 KiB random over a 16 GiB span at QD3 "
           "(1x3), 100 % reads adding 20 % writes a phase (six mixes); MB/s and their average",
           {"sweeps": (((1, 3), SIX_SHARES, "random"),), "span": 16 * GIB,
            "duration_s": MIX_POINT_S},
           "the point length and whether 16GB is GB or GiB: 3 min (Iometer's, as in seed 004), "
           "16 GiB"),
    Preset("seed001-seqmix", "seqmix", SEED_001, "AnandTech, Samsung SM951 (2015): mixed sequential",
           "whole-target fill, then 128 KiB sequential over the whole target at QD1, the six "
           "mixes; MB/s and their average",
           {"read_shares": SIX_SHARES, "span": "target", "duration_s": MIX_POINT_S},
           "the point length: 3 min"),
    Preset("seed002-steady", "steady", SEED_002, "AnandTech, Micron M510DC (2015): 70/30 steady state",
           "2 h of 128 KiB sequential writes, 6 h of 4 KiB 70/30 random at QD32 scored on the "
           "last 500 s (IOPS, consistency, share over 10 ms), QD scaling QD1..QD32 at 70/30, "
           "then the six mixes at QD32",
           {"read_share": 0.7, "precondition_s": STEADY_70_30_PRECONDITION_S,
            "duration_s": STEADY_70_30_S, "window_s": STEADY_70_30_WINDOW_S, "round_s": ROUND_S,
            "qd_scaling": QD_SCALING, "read_shares": SIX_SHARES, "point_s": MIX_POINT_S,
            "span": "target"},
           "the QD steps, the length of the QD-scaling and sweep points and the steady-state "
           "rounds: QD 1, 2, 4, 8, 16, 32, 3 min a point, 1-minute rounds"),
    Preset("seed003-steady", "steady", SEED_003, "AnandTech, Maxiotek MK8115 (2017): performance consistency",
           "whole-target fill, then an hour of 4 KiB random writes at QD32 scored on the last "
           "400 s (average IOPS, average / stddev)",
           {"read_share": 0.0, "duration_s": STEADY_S, "window_s": float(scoring.CONSISTENCY_WINDOW_S),
            "round_s": ROUND_S, "span": "target"},
           "the steady-state rounds: 1 minute"),
    Preset("seed004-iometer", "mix", SEED_004, "AnandTech, OCZ Vertex 3 (2011): Iometer 4 KiB random",
           "over an 8 GiB span, 3 min each: random writes at QD3 with fully random then "
           "pseudo-random data, the same at QD32, then random reads at QD3; average MB/s",
           {"sweeps": (((1, 3), (0.0,), "random"), ((1, 3), (0.0,), PSEUDO_RANDOM),
                       ((1, 32), (0.0,), "random"), ((1, 32), (0.0,), PSEUDO_RANDOM),
                       ((1, 3), (1.0,), "random")),
            "span": 8 * GIB, "duration_s": MIX_POINT_S, "fill": False},
           "a fill and the pseudo-random data's ratio: no fill, half of every 4 KiB zeros "
           f"({PSEUDO_RANDOM})"),
)}
_WHOLE_SECONDS = ("window_s", "round_s", "period_s")


def preset_options(name: str, scale: float = 1.0, overrides: dict | None = None):
    """(test, BenchOptions) of preset `name` at `scale`; `overrides` (BenchOptions fields the
    user gave) replace the preset's, and are recorded as not the review's."""
    preset = PRESETS.get(name)
    if preset is None:
        raise BenchError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} "
                         "(replay bench --list shows them)")
    o = BenchOptions(scale=scale)
    fields = {}
    for key, value in preset.options.items():
        if key.endswith("_s") and value is not None:
            value = o.scaled(value, whole=key in _WHOLE_SECONDS)
        fields[key] = value
    fields.update(overrides or {})
    return preset.test, BenchOptions(scale=scale, **fields)


def describe_preset(preset: Preset) -> list[str]:
    """The preset's parameters in words, as `replay bench --list` shows them."""
    test, o = preset_options(preset.name)
    lines = [f"{preset.name}: seed {preset.seed} ({preset.review}); replay bench {test}",
             f"  {preset.summary}"]
    whole = o.span == "target" or (o.span is None and test != "mix")
    params = [f"span {'the whole target' if whole else human_bytes(o.span or MIX_SPAN)} from offset 0"]
    if test in ("mix", "seqmix", "steady"):
        params.append("fill: " + ("none" if not o.fill else "the whole target, 128 KiB sequential"
                                  + (", before each sweep" if test == "mix" else "")))
    if test == "mix":
        params += ["sweeps in order: " + "; ".join(
            f"{split_label(split)} ({split[0]} worker(s) at QD{split[1]}), reads "
            + "/".join(str(_pct(x)) for x in shares) + f" %, data {data}"
            for split, shares, data in o.sweeps)]
    if test == "seqmix":
        params += ["128 KiB sequential, 1x1, reads " + "/".join(str(_pct(x)) for x in o.read_shares) + " %"]
    if test == "steady":
        params += [f"4 KiB random, {_pct(o.read_share)} % reads, 1x32",
                   f"precondition {o.precondition_s or 0:g} s" if o.precondition_s else "precondition: one fill",
                   f"scored window: last {o.window_s:g} s, rounds of {o.round_s:g} s"]
        if o.qd_scaling:
            params.append("then QD scaling " + ", ".join(f"QD{q}" for q in o.qd_scaling)
                          + f", {o.point_s:g} s each")
        if o.read_shares:
            params.append("then reads " + "/".join(str(_pct(x)) for x in o.read_shares)
                          + f" % at 1x32, {o.point_s:g} s each")
    if test == "act":
        params += [f"search from {o.start}x by {o.step}x", f"period {o.period_s:g} s",
                   "act_prep first", "latency from the due time (queue-era ACT)"]
    if o.duration_s:
        params.append(f"duration {o.duration_s:g} s" + (" a point" if test in ("mix", "seqmix") else ""))
    lines.append("  " + "; ".join(params))
    if preset.unstated:
        lines.append(f"  not stated in the seed: {preset.unstated}")
    return lines


def run_bench(test, target, out_dir, options: BenchOptions | None = None, on_run=None,
              notices=None, preset: dict | None = None) -> dict:
    """Run standard test `test` on `target` (None with the null engine) into `out_dir`;
    `preset` ({"name", "seed", "overrides"}) is recorded in results.json."""
    bench = Bench(test, target, out_dir, options, on_run, notices)
    bench.preset = preset
    return bench.run()
