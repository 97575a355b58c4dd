"""`replay suite`: every captured workload of a trace library replayed on one target, one after
another, into one results directory: DIR/<workload>.parquet, and DIR/results.json, a results
set of test "suite" holding the scores of analysis.suite.
"""
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from analysis.results import SUITE_TEST, ResultsSet
from analysis.suite import SuiteScores, score_set
from replay.bench.options import FORMAT, VERSION
from replay.bench.session import check_out_dir, fill_generator, write_index
from replay.runner import GeneratorSource, RunOptions, TraceSource, null_target, replay
from traces import library
from traces.errors import ReplayError
from traces.targets import inspect_target
from traces.trace import open_trace

# empty: the target as it is; full: filled with sequential writes first, as the Storage
# Bench's full-drive runs.
STATES = ("empty", "full")


class SuiteError(ReplayError):
    """The suite cannot run as asked; the message says what to change."""


@dataclass
class SuiteOptions:
    timing: str = "causal"  # one of replay.options.Timing
    only: tuple = ()  # workload names; empty: all
    skip: tuple = ()
    state: str = "empty"
    library: Path | None = None  # a directory of traces; None: the bundled library
    engine: str | None = None
    remap: str = "fail"
    calibrate: bool = True
    destroy_data: bool = False


def captured(directory: Path) -> list[str]:
    """The names of the captured traces in `directory` (by `replay capture`, with a recipe or
    not): the synthetic and imported traces there are no workloads of the suite."""
    names = []
    for path in sorted(directory.glob(f"*{library.SUFFIX}")):
        source = open_trace(path).metadata.get("source") or {}
        if str(source.get("kind", "")).startswith("capture"):
            names.append(path.stem)
    return names


def select(directory: Path, only=(), skip=()) -> list[str]:
    """The workloads to replay, in the library's order; unknown names are refused."""
    names = captured(directory)
    if not names:
        raise SuiteError(f"{directory} holds no captured trace (made by `replay capture`); give "
                         "--library a directory of them")
    for flag, given in (("--only", only), ("--skip", skip)):
        unknown = [n for n in given if n not in names]
        if unknown:
            raise SuiteError(f"{flag}: {', '.join(unknown)} is no workload of the suite; its "
                             f"workloads are {', '.join(names)}")
    chosen = [n for n in names if (not only or n in only) and n not in skip]
    if not chosen:
        raise SuiteError(f"--only and --skip leave no workload to replay (the workloads are "
                         f"{', '.join(names)})")
    return chosen


class Suite:
    """One `replay suite [TARGET] -o DIR`. Every check `replay run` makes is made for every
    workload before anything is written; `run()` then replays them, recording each in
    DIR/results.json as it finishes, and scores them.

    `progress(done, total, elapsed_s, label=...)` hears of the I/Os done across the suite.
    """

    def __init__(self, target, out_dir, options: SuiteOptions | None = None, progress=None,
                 notices=None):
        self.options = o = options or SuiteOptions()
        if o.state not in STATES:
            raise SuiteError(f"--state must be one of {', '.join(STATES)}, not {o.state!r}")
        if target is None and o.engine != "null":
            raise SuiteError("give a TARGET (a block device or a regular file); only --engine null "
                             "runs without one")
        directory = Path(o.library) if o.library else library.library_dir()
        if not directory.is_dir():
            raise SuiteError(f"--library {directory}: no such directory")
        self.target_arg = None if target is None else str(target)
        self.out_dir = Path(out_dir)
        self.progress, self.notices = progress, [] if notices is None else notices
        self.paths = {name: directory / f"{name}{library.SUFFIX}"
                      for name in select(directory, o.only, o.skip)}
        # DIR's files of the same names are replaced, as a bench's are.
        self.run_options = RunOptions(timing=o.timing, engine=o.engine, remap=o.remap,
                                      calibrate=o.calibrate, destroy_data=o.destroy_data, force=True)
        self.target = null_target(0) if target is None else inspect_target(self.target_arg)
        check_out_dir(self.out_dir, self.target)
        self.rows = self._check()
        # Checked once, above, as the bench does: the workloads' own writes (their captures ran
        # on filesystems) leave signatures that would refuse the next one.
        self.run_options = replace(self.run_options, destroy_data=True)
        self.runs: list[dict] = []
        self.started = datetime.now(timezone.utc).isoformat()

    def _check(self) -> dict:
        """A dry run of every workload, with its results file, before anything is written:
        the options, the trace, the target's write safety and the mapping onto it. Returns
        each workload's I/Os. (The traces are read again to be replayed: held, the scans of a
        whole library would take hundreds of MB.)"""
        made = not self.out_dir.exists()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rows = {}
        try:
            for name, path in self.paths.items():
                source = TraceSource(path)
                replay(source, self.target_arg, replace(self.run_options, dry_run=True),
                       output=self.out_dir / f"{name}.parquet", notices=[])
                rows[name] = source.scan.rows
        except BaseException:
            if made:
                self.out_dir.rmdir()
            raise
        return rows

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> tuple[dict, SuiteScores | None]:
        """Replay every workload; returns results.json's document and the scores (None when no
        workload was replayed). Ctrl-C ends the suite, keeping every run done and the one it
        stopped, marked interrupted."""
        self._clock = time.monotonic()
        interrupted = False
        try:
            if self.options.state == "full":
                self._fill()
            total, done = sum(self.rows.values()), 0
            for i, (name, path) in enumerate(self.paths.items()):
                label = f"{i + 1}/{len(self.paths)} {name}"
                outcome = self._replay(name, "measure", path, self.run_options, done, total, label)
                done += self.rows[name]
                if outcome.interrupted or outcome.signum:
                    interrupted = True
                    break
        except KeyboardInterrupt:  # before a run's first I/O: nothing of it to keep
            interrupted = True
        self._save(interrupted)
        measured = any(r["role"] == "measure" for r in self.runs)
        scores = score_set(ResultsSet(self.out_dir)) if measured else None
        return self._save(interrupted, scores), scores

    def _fill(self):
        """--state full: the whole target written with 128 KiB sequential writes, as the bench
        fills it."""
        gen = fill_generator(self.target.size)
        options = RunOptions(timing="afap", qd=32, engine=self.options.engine, destroy_data=True,
                             force=True)
        outcome = self._replay("fill", "precondition", GeneratorSource(gen, "fill"), options, 0,
                               gen.count, "filling")
        if outcome.interrupted or outcome.signum:
            raise KeyboardInterrupt

    def _replay(self, name, role, source, options, before, total, label):
        def progress(done, _total, _elapsed):
            if self.progress is not None:
                self.progress(before + done, total, time.monotonic() - self._clock, label=label)

        output = self.out_dir / f"{name}.parquet"
        outcome = replay(source, self.target_arg, options, output=output, progress=progress,
                         notices=self.notices,
                         metadata={"bench": {"test": SUITE_TEST, "run": name, "role": role}})
        if outcome.rows == 0:  # stopped before its first I/O: a file of no rows is no results
            output.unlink(missing_ok=True)
            self.notices.append(f"{name} was stopped before its first I/O; nothing of it is kept")
            return outcome
        self.runs.append({"name": name, "file": f"{name}.parquet", "role": role,
                          "parameters": {"trace": str(source) if isinstance(source, Path) else None,
                                         "timing": options.timing},
                          "interrupted": outcome.interrupted,
                          "summary": outcome.summary.to_dict()["tracereplay"]})
        self._save(outcome.interrupted)
        return outcome

    def _save(self, interrupted, scores: SuiteScores | None = None) -> dict:
        doc = {
            "format": FORMAT, "version": VERSION, "test": SUITE_TEST, "target": asdict(self.target),
            "started": self.started, "finished": datetime.now(timezone.utc).isoformat(),
            "interrupted": interrupted,
            "options": {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
                        for k, v in asdict(self.options).items()},
            "runs": self.runs,
            "scores": {} if scores is None else {"composite": scores.composite, "suite": scores.to_dict()},
        }
        write_index(self.out_dir, doc)
        return doc
