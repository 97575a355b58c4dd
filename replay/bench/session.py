"""One `replay bench` invocation: the test's options checked against its target, each run
replayed into DIR/<run>.parquet and recorded in DIR/results.json as soon as it finishes.
"""
import json
import os
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from analysis import power, scoring
from replay.bench import TESTS, procedures
from replay.bench.options import (FILL_BLOCK, FORMAT, KIB, MIB, MIX_SPAN, VERSION, BenchError,
                                  BenchOptions, check_numbers, check_op, op_prefix)
from replay.bench.scores import power_scores
from replay.options import DATA_PATTERN, MAX_DEPTH, MAX_WORKERS
from replay.runner import GeneratorSource, RunOptions, null_target, replay
from synth import generators as g
from traces.outputs import check_output
from traces.targets import check_safe_to_write, inspect_target
from traces.trace import open_trace
from traces.units import human_bytes


def write_index(out_dir: Path, doc: dict) -> None:
    """Write a results set's index, DIR/results.json, whole or not at all: a crash keeps the
    last one written."""
    tmp = out_dir / f".results.json.{os.getpid()}.partial"
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False))
    os.replace(tmp, out_dir / "results.json")


def check_out_dir(out_dir: Path, target) -> None:
    """Refuse, before anything is written, a results directory whose files would replace
    something: results.json a device node or the target, or a file target inside it, where
    each run's results file is replaced by name."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BenchError(f"the results directory {out_dir} is not a directory; give a new "
                         "or existing directory")
    if target.kind == "file" and Path(target.path).parent == out_dir.resolve():
        raise BenchError(f"the target {target.path} is inside the results directory "
                         f"{out_dir}, whose files the runs replace; move it or choose another -o")
    if out_dir.is_dir():
        check_output(out_dir / "results.json", target=target, force=True)


def fill_generator(span: int, passes: int = 1, seed: int = 0):
    """The reviews' fill: sequential 128 KiB writes over `span` bytes from offset 0."""
    return g.sequential_fill(span=span, passes=passes, block_size=FILL_BLOCK, seed=seed)


class Stopped(Exception):
    """A run was interrupted (Ctrl-C): the suite ends, keeping what it has."""


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
        check_numbers(o)
        if target is None and o.engine != "null":
            raise BenchError("give a TARGET (a block device or a regular file); only "
                             "--engine null runs without one")
        self.target_arg = None if target is None else str(target)
        if isinstance(o.op, (int, float, str)):
            o.op = (o.op,)
        o.op = tuple(check_op(p) for p in o.op)
        if not o.op or len(set(o.op)) < len(o.op):
            raise BenchError(f"--op takes each over-provisioning percent once, not "
                             f"{','.join(map(str, o.op)) or 'none'}")
        default_span = MIX_SPAN if test == "mix" else None
        if self.target_arg is None:
            null_span = max(MIX_SPAN if o.span in (None, "target") else o.span, o.fill_bytes or 0)
            # Large enough that the most over-provisioned pass still holds the span.
            self.target = null_target(-(-null_span * 100 // (100 - max(o.op)) // MIB) * MIB)
        else:
            self.target = inspect_target(self.target_arg)
        if isinstance(o.data, str):
            o.data = tuple(o.data.split(","))
        for pattern in o.data:
            if not DATA_PATTERN.fullmatch(pattern):
                raise BenchError(f"--data {pattern!r} is not a data pattern: use random, zeros "
                                 "or compressible:PCT with PCT from 0 to 100")
        # Every option the runs would refuse is refused here, before the fill writes the target.
        for w, q in o.qd_splits or ():
            if not (1 <= w <= MAX_WORKERS and 1 <= q <= MAX_DEPTH):
                raise BenchError(f"a queue-depth split takes 1 to {MAX_WORKERS} workers at QD 1 to "
                                 f"{MAX_DEPTH}, not {w}x{q}")
        if any(not 1 <= q <= MAX_DEPTH for q in o.qd_scaling):
            raise BenchError(f"--qd-scaling takes queue depths from 1 to {MAX_DEPTH}, not "
                             f"{','.join(map(str, o.qd_scaling))}")
        for size in o.block_sizes or ():
            if size <= 0 or size % 512:
                raise BenchError(f"--block-sizes takes positive multiples of 512 bytes, not {size}")
        power.check_layout(o.power_columns, o.power_time_unit)
        self.limits = {op: self._limit(op) for op in o.op}
        self.spans = {op: self._span(test, op, default_span) for op in o.op}
        if self.target.kind == "block":
            check_safe_to_write(self.target, o.destroy_data)
        check_out_dir(self.out_dir, self.target)
        self.runs: list[dict] = []
        self.all_scores: dict = {}  # the first pass's scores, and each later pass's as opP
        self.scores = self.all_scores  # the current pass's
        self.passes: list[dict] = []  # each --op pass begun: its percent, discard and limit
        self.op = o.op[0]
        self.span, self.limit = self.spans[self.op], self.limits[self.op]
        self.started = datetime.now(timezone.utc).isoformat()
        self.power = None  # the power log's summary, once read (--power-log)
        self.preset = None  # set by run_bench for a seed preset: its name, seed and overrides

    def _limit(self, op: int) -> int:
        """Bytes from offset 0 a pass at `op` % over-provisioning may touch: the whole target at
        0, else the first (100 - op) % of it in whole MiB."""
        if not op:
            return self.target.size
        limit = self.target.size * (100 - op) // 100 // MIB * MIB
        if limit <= 0:
            raise BenchError(f"{self.target.path} holds {human_bytes(self.target.size)}, too little "
                             f"to leave {op} % unused and test a whole MiB; give a smaller --op or "
                             "a larger target")
        return limit

    def _span(self, test: str, op: int, default_span) -> int:
        """The span a pass at `op` tests, refused when the target (or its first (100 - op) %)
        cannot hold it or the fill."""
        o, limit = self.options, self.limits[op]
        usable = limit // MIB * MIB
        span = usable if o.span == "target" else int(o.span or default_span or usable)
        room = (f"--op {op} leaves {human_bytes(limit)} ({limit} bytes) of {self.target.path}"
                if op else f"{self.target.path} holds {human_bytes(self.target.size)}")
        if o.fill_bytes is not None and not 0 < o.fill_bytes <= limit:
            raise BenchError(f"--fill must be between 1 byte and "
                             + (f"the {limit} bytes --op {op} leaves" if op else
                                f"the target's {limit} bytes") + f", not {o.fill_bytes}")
        if span <= 0 or span % (4 * KIB):
            raise BenchError(f"--span must be a positive multiple of 4 KiB, not {span} bytes")
        if span > limit:
            raise BenchError(
                f"the {test} test spans {human_bytes(span)} ({span} bytes) but {room}; give "
                f"--span {usable} or less, " + ("a smaller --op " if op else "") + "or a larger target")
        return span

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> dict:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        interrupted = False
        try:
            for i, op in enumerate(self.options.op):
                self._begin_pass(i, op)
                procedures.PROCEDURES[self.test](self)
        except (Stopped, KeyboardInterrupt):
            interrupted = True
        results = self._save(interrupted, finished=True)
        if self.options.power_log is None:
            return results
        try:
            self._measure_power()
        except power.PowerLogError as e:
            raise BenchError(f"{e}; the runs' results are kept, without power, in "
                             f"{self.out_dir / 'results.json'}") from None
        return self._save(interrupted, finished=True)

    def _measure_power(self) -> None:
        """Each run's average power and efficiency from --power-log, aligned by wall-clock time:
        a run spans its results file's start time plus its duration (first I/O to last
        completion; the start is taken some 20 ms before the first I/O is due)."""
        o = self.options
        log = power.read_log(o.power_log, o.power_columns, o.power_time_unit, o.power_start)
        for run in self.runs:
            run["power"] = power.measure(log, run["started"], run["summary"])
        if not any(run["power"] for run in self.runs):
            starts = [power.parse_when(run["started"]) for run in self.runs]
            last = self.runs[-1]
            raise power.no_overlap(log, min(starts),
                                   max(starts) + last["summary"]["duration_ns"] / 1e9)
        for p in self.passes:  # each pass's headline power, as its charts draw it
            s = self.all_scores if p["scores"] is None else self.all_scores.get(p["scores"], {})
            s.update(power_scores(self.test, s, self.runs, op_prefix(p["op"]), log))
        self.power = {"log": str(o.power_log), "log_start": log.start_s, "log_end": log.end_s,
                      "samples": len(log.t_s)}

    def _begin_pass(self, i: int, op: int) -> None:
        """Start the test's pass at `op` % over-provisioning: the first pass's scores go at the
        top, a later one's under "opP". Over-provisioning first discards the whole target, as
        a secure erase would, so that the unused rest is spare area the drive knows is free."""
        self.op, self.span, self.limit = op, self.spans[op], self.limits[op]
        self.scores = self.all_scores if i == 0 else self.all_scores.setdefault(f"op{op}", {})
        self.passes.append({"op": op, "discarded_bytes": self.target.size if op else 0,
                            "limit_bytes": self.limit, "span": self.span,
                            "scores": None if i == 0 else f"op{op}"})
        if op:
            self.run_one("discard", "precondition",
                         procedures.discard_generator(0, self.target.size, self.options.seed))

    def _save(self, interrupted=False, finished=False) -> dict:
        results = {
            "format": FORMAT, "version": VERSION, "test": self.test,
            "target": asdict(self.target), "started": self.started,
            "finished": datetime.now(timezone.utc).isoformat() if finished else None,
            "interrupted": interrupted, "span": self.span, "op": self.passes,
            "preset": self.preset,
            "options": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in asdict(self.options).items()},
            "runs": self.runs, "scores": self.all_scores, "power": self.power,
        }
        write_index(self.out_dir, results)
        return results

    def run_one(self, name, role, generator, *, qd=32, workers=1, afap=True, max_inflight=None,
                time_limit_s=None, consumers=(), data="random"):
        """Run one generator on the target into DIR/<name>.parquet and record it; an open-loop
        run (not `afap`) keeps at most `max_inflight` I/Os in flight (default the replayer's).
        A run that ACT gave up on (scoring.ActGaveUp from a consumer) is recorded, then re-raised."""
        o = self.options
        # An open-loop run hands its results over in smaller chunks, so that a consumer
        # watching it (ACT's early stop) hears of a backlog within seconds.
        chunk_rows = o.chunk_rows if afap else min(o.chunk_rows, 4096)
        limits = {} if max_inflight is None else {"max_inflight": max_inflight}
        options = RunOptions(timing="afap" if afap else "original", qd=qd, workers=workers, engine=o.engine,
                             **limits,
                             destroy_data=True,  # checked once, before the first run
                             force=True,  # -o DIR's files of the same names are replaced
                             time_limit_s=time_limit_s, chunk_rows=chunk_rows, data=data)
        name = op_prefix(self.op) + name
        file = f"{name}.parquet"
        parameters = {"generator": generator.name, **generator.parameters(), "afap": afap,
                      "qd": qd, "workers": workers, **limits, "time_limit_s": time_limit_s, "data": data,
                      "op": self.op}
        said = {"test": self.test, "run": name, "role": role, **({"op": self.op} if self.op else {})}
        try:
            outcome = replay(GeneratorSource(generator, name), self.target_arg, options,
                             output=self.out_dir / file, notices=self.notices, consumers=consumers,
                             metadata={"bench": said})
        except scoring.ActGaveUp as e:
            md = open_trace(self.out_dir / file).metadata  # closed by the runner, rows kept
            self.runs.append({"name": name, "file": file, "role": role, "parameters": parameters,
                              "interrupted": False, "gave_up": str(e),
                              "started": md["run"]["started"],
                              "summary": md["summary"]["tracereplay"]})
            self._save()
            if self.on_run:
                self.on_run(self.runs[-1])
            raise
        entry = {
            "name": name, "file": file, "role": role, "parameters": parameters,
            "interrupted": outcome.interrupted,
            # The wall-clock start, which --power-log aligns the meter's samples to.
            "started": open_trace(self.out_dir / file).metadata["run"]["started"],
            "summary": outcome.summary.to_dict()["tracereplay"],
        }
        self.runs.append(entry)
        self._save()
        if self.on_run:
            self.on_run(entry)
        if outcome.interrupted or outcome.signum:
            raise Stopped
        return outcome

    @property
    def fill_span(self) -> int:
        """Bytes a fill writes from offset 0: the whole target (its first (100 - op) % with
        --op) unless --fill says less. The reviews fill the drive, not the span they test: the
        unwritten rest would otherwise act as spare area and raise every write-bearing point."""
        return int(self.options.fill_bytes or self.limit)

    def fill(self, name="fill", passes=1, data="random"):
        if self.options.fill:
            self.run_one(name, "precondition", fill_generator(self.fill_span, passes, self.options.seed),
                         data=data)


def run_bench(test, target, out_dir, options: BenchOptions | None = None, on_run=None,
              notices=None, preset: dict | None = None) -> dict:
    """Run standard test `test` on `target` (None with the null engine) into `out_dir`;
    `preset` ({"name", "seed", "overrides"}) is recorded in results.json."""
    bench = Bench(test, target, out_dir, options, on_run, notices)
    bench.preset = preset
    return bench.run()
