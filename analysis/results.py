"""Opening replay results: one results file (`replay run`) or a results set (a `replay bench`
directory), with their metadata up front and their rows streamed by row groups.

Only the footer and results.json are read on `load`; rows are read when asked for.
"""
import json
import queue
import threading
from pathlib import Path

from analysis.summary import RunSummary
from traces.errors import ReplayError, TraceFormatError
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS
from traces.trace import open_trace

RESULTS_KIND = "results"
SET_FORMAT = "tracereplay-results-set"
SET_VERSION = 1
SET_FILE = "results.json"
SUITE_TEST = "suite"  # a results set of `replay suite`: a run per real workload
_NEEDED = (*TRACE_COLUMNS, *RESULT_COLUMNS)
# Rows per chunk for the summary: fewer Python round trips. CPU over 10M rows (read and
# summary): 0.96-1.11 s with the reader's default of 65,536 rows, 0.87-0.92 with 2**20.
_SUMMARY_ROWS = 1 << 20
_END = object()


class ResultsError(ReplayError):
    """A path that cannot be analysed as replay results: missing, not results, or empty."""


def load(path) -> "Results | ResultsSet":
    """A results file (Parquet written by `replay run`) or a results set (a directory written by
    `replay bench`, or its results.json). Raises ResultsError with one sentence on what is wrong."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(
            f"{path}: no such file or directory; give a results file written by `replay run` "
            "or a directory written by `replay bench`"
        )
    if path.is_dir() and (path / "cluster.json").is_file() and (path / "run.parquet").is_file():
        return Results(path / "run.parquet")  # `replay run --plan`: every host's rows, one run
    if path.is_dir() or path.name == SET_FILE:
        return ResultsSet(path.parent if path.name == SET_FILE and path.is_file() else path)
    return Results(path)


class Results:
    """One results file: the trace's columns plus intended/issue/complete times and result.

    `role` and `parameters` are set for a run of a results set (None for a lone file).
    `summary` is rebuilt by streaming the rows once (then cached): the metadata's summary is a
    JSON dict without histograms (it is `summary_dict`, used when present).
    """

    def __init__(self, path, role=None, parameters=None, run_name=None):
        self.path = Path(path)
        try:
            self._trace = open_trace(self.path)
        except TraceFormatError as e:
            raise ResultsError(
                f"{self.path}: not a results file ({e.problem}); give a file written by "
                "`replay run` or `replay bench`"
            ) from None
        self.metadata = self._trace.metadata
        missing = [name for name in _NEEDED if not self._trace.has(name)]
        if self.metadata.get("kind") != RESULTS_KIND or missing:
            what = "a trace" if not any(self._trace.has(n) for n in RESULT_COLUMNS) else "not a results file"
            raise ResultsError(
                f"{self.path}: {what}, not the results of a replay (no "
                f"{', '.join(missing) or 'results metadata'}); replay it first with "
                f"`replay run {self.path} TARGET`"
            )
        if self._trace.num_rows == 0:
            why = " (the run was interrupted before any I/O)" if self.metadata.get("interrupted") else ""
            raise ResultsError(f"{self.path}: the results file holds no I/Os{why}; run the replay again")
        self.role = role
        self.parameters = parameters
        self.run_name = run_name or (self.metadata.get("bench") or {}).get("run") or self.path.stem
        self._summary = None

    def __repr__(self):
        return f"Results({str(self.path)!r}, name={self.name!r}, rows={self.rows})"

    @property
    def name(self) -> str:
        """The replayed trace's name."""
        return str(self.metadata.get("name") or self.trace.get("metadata", {}).get("name") or "")

    @property
    def trace(self) -> dict:
        """{"path", "rows", "metadata"} of the replayed trace."""
        return self.metadata.get("trace") or {}

    @property
    def target(self) -> dict:
        return self.metadata.get("target") or {}

    @property
    def run(self) -> dict:
        """How it was replayed: engine, mode ("afap" or "original"), speed, qd, workers, ..."""
        return self.metadata.get("run") or {}

    @property
    def interrupted(self) -> bool:
        return bool(self.metadata.get("interrupted"))

    @property
    def rows(self) -> int:
        return self._trace.num_rows

    @property
    def columns(self) -> list[str]:
        return list(self._trace.column_names)

    def has(self, column) -> bool:
        return self._trace.has(column)

    @property
    def closed_loop(self) -> bool:
        return self.run.get("mode") == "afap"

    @property
    def runs_to_finish(self) -> bool:
        """Closed-loop and causal replays run as the workload would, so their time to finish
        counts; causal ones keep the application's own time between I/Os, so theirs is its
        run time."""
        return self.closed_loop or self.run.get("mode") == "causal"

    @property
    def speed(self) -> float:
        return float(self.run.get("speed") or 1.0)

    def chunks(self, columns=None, rows=None, ahead=0):
        """Row groups as dicts of numpy arrays, in trace order, validated as they are read.

        With `ahead` > 0 a thread reads and decodes up to that many chunks ahead of the
        caller (Parquet decoding releases the GIL, so it overlaps the caller's work); the
        thread ends when the iteration does, however it ends.
        """
        chunks = self._trace.chunks(columns=columns, rows=rows)
        return _read_ahead(chunks, ahead) if ahead > 0 else chunks

    @property
    def summary(self) -> RunSummary:
        if self._summary is None:
            summary = RunSummary(jobname=self.name or "tracereplay")
            for chunk in self.chunks(["op", "length", *RESULT_COLUMNS], rows=_SUMMARY_ROWS, ahead=1):
                summary.add(chunk)
            self._summary = summary
        return self._summary

    def cache_summary(self, summary: RunSummary) -> None:
        """Keep a summary built from these rows elsewhere (analysis.analyse's single pass)."""
        self._summary = summary

    @property
    def summary_dict(self) -> dict:
        """RunSummary.to_dict() as stored at the end of the run, or rebuilt when absent."""
        stored = self.metadata.get("summary")
        return stored if isinstance(stored, dict) else self.summary.to_dict()


class ResultsSet:
    """A `replay bench` directory: results.json plus one results file per run."""

    def __init__(self, path):
        self.path = Path(path)
        index = self.path / SET_FILE
        if not index.is_file():
            raise ResultsError(
                f"{self.path}: a directory without {SET_FILE}, so not a results set; give a "
                "directory written by `replay bench` or a results file"
            )
        try:
            doc = json.loads(index.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ResultsError(f"{index}: not readable as JSON ({e}); was the bench run cut short?") from None
        if not isinstance(doc, dict) or doc.get("format") != SET_FORMAT:
            raise ResultsError(f"{index}: not a tracereplay results set (format is not {SET_FORMAT!r})")
        if not isinstance(doc.get("version"), int) or doc["version"] > SET_VERSION:
            raise ResultsError(
                f"{index}: results set version {doc.get('version')!r}, this tracereplay reads up "
                f"to {SET_VERSION}; upgrade tracereplay"
            )
        self.metadata = doc
        runs = doc.get("runs")
        if not isinstance(runs, list) or not runs:
            raise ResultsError(f"{index}: lists no runs; the bench stopped before its first run finished")
        self.runs = []
        for i, run in enumerate(runs):
            if not isinstance(run, dict) or not run.get("file"):
                raise ResultsError(f"{index}: run {i} has no results file named")
            file = self.path / run["file"]
            if not file.exists():
                raise ResultsError(f"{index}: run {run.get('name', i)!r} names {file}, which does not exist")
            self.runs.append(Results(file, role=run.get("role"), parameters=run.get("parameters") or {},
                                     run_name=run.get("name")))

    def __repr__(self):
        return f"ResultsSet({str(self.path)!r}, test={self.test!r}, runs={len(self.runs)})"

    @property
    def test(self) -> str:
        return str(self.metadata.get("test") or "")

    @property
    def name(self) -> str:
        """The bench test's name: what two sets must share to be compared."""
        return self.test

    @property
    def target(self) -> dict:
        return self.metadata.get("target") or {}

    @property
    def scores(self) -> dict:
        return self.metadata.get("scores") or {}

    @property
    def options(self) -> dict:
        return self.metadata.get("options") or {}

    @property
    def interrupted(self) -> bool:
        return bool(self.metadata.get("interrupted")) or any(r.interrupted for r in self.runs)

    @property
    def suite(self) -> bool:
        """A `replay suite` set: its measured runs are replays of real workloads."""
        return self.test == SUITE_TEST

    def measured(self) -> list[Results]:
        """The runs that are scored (role "measure"), in order."""
        return [r for r in self.runs if r.role == "measure"]


def _read_ahead(chunks, depth):
    """Yield what the iterator `chunks` yields, produced by a thread at most `depth` items ahead;
    its exception is raised here, in order. Closing this generator (or its caller stopping
    early) stops the thread and closes `chunks` before returning."""
    ready = queue.Queue(depth)
    stop = threading.Event()

    def put(item):
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for chunk in chunks:
                if not put((chunk, None)):
                    return
            put((_END, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((None, exc))
        finally:
            chunks.close()

    thread = threading.Thread(target=produce, name="results-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            chunk, error = ready.get()
            if error is not None:
                raise error
            if chunk is _END:
                return
            yield chunk
    finally:
        stop.set()
        thread.join()
