"""Feeding the workers and merging their results: the trace's chunks cut into pieces a crash
can afford to lose, dealt row by row to the workers, and put back together in trace order.
"""
import time
from collections import deque

import numpy as np

from replay.options import RunOptions, Timing
from replay.output import RESULT_FLUSH_S


def pieces(chunks, options: RunOptions, merger):
    """The trace's chunks, cut so that each piece pushed completes within about RESULT_FLUSH_S:
    the engine hands back whole pieces, so a piece is what a SIGKILL can lose. With timing,
    by the trace's clock; with --afap, by the rate measured so far (8,192 rows to begin)."""
    started, rows = None, 8192
    span_ns = RESULT_FLUSH_S * options.speed * 1e9
    for chunk in chunks:
        n = len(chunk["op"])
        if options.timing != Timing.afap:
            ts = chunk["ts_ns"]
            if n == 0 or ts[-1] - ts[0] <= span_ns:
                yield chunk
                continue
            cuts = np.flatnonzero(np.diff((ts - ts[0]) // int(span_ns))) + 1
        else:
            if started is None:
                started = time.monotonic()
            elif merger.done:
                rate = merger.done / max(time.monotonic() - started, 1e-3)
                rows = int(min(max(rate * RESULT_FLUSH_S, 1024), 1 << 30))
            if n <= rows:
                yield chunk
                continue
            cuts = np.arange(rows, n, rows)
        for lo, hi in zip([0, *cuts], [*cuts, n]):
            yield {name: col[lo:hi] for name, col in chunk.items()}


class Merger:
    """Deals each chunk's rows to the workers (row i to worker i % N), and puts their results
    back together in trace order as they finish, writing rows that were issued."""

    def __init__(self, reps, writer, summary, consumers=(), summarising=True):
        self.reps, self.writer, self.summary = reps, writer, summary
        # Whether `summary` counts the rows as they are written; if not, `close_results` makes
        # it from the journal.
        self.summarising = summarising
        self.consumers = list(consumers)
        self.pending = deque()  # chunks pushed, not yet written
        self.results = [deque() for _ in reps]  # per worker, in push order
        self.finished = set()  # workers whose run is over
        self.done = 0

    def push(self, chunk):
        n = len(self.reps)
        deps = chunk.pop("causal", None)  # causal timing's columns go to the engine, not the results
        self.pending.append(chunk)
        for w, rep in enumerate(self.reps):
            part = {name: np.ascontiguousarray(chunk[name][w::n])
                    for name in ("ts_ns", "op", "offset", "length")}
            flags = np.ascontiguousarray(chunk["flags"][w::n]) if "flags" in chunk else None
            if deps is None:
                rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], flags)
            else:  # one worker: check_causal
                rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], flags,
                         parent=deps["parent"].astype(np.uint32), parent2=deps["parent2"].astype(np.uint32),
                         think_ns=deps["think_ns"])

    def collect(self, block: bool) -> bool:
        """Take what the workers have finished (with block, wait for each worker's next chunk
        or its end) and write every complete chunk. False once nothing more can come."""
        for w, rep in enumerate(self.reps):
            while w not in self.finished and not (block and self.results[w]):
                got = rep.take(block)
                if got is None:
                    if block:
                        self.finished.add(w)
                    break
                self.results[w].append(got)
        ready = lambda w: self.results[w] or w in self.finished  # noqa: E731
        while self.pending and all(ready(w) for w in range(len(self.reps))):
            self._write(self.pending.popleft(), [r.popleft() if r else None for r in self.results])
        return bool(self.pending) and len(self.finished) < len(self.reps)

    def _write(self, chunk, parts):
        n_rows, n = len(chunk["op"]), len(self.reps)
        names = ("intended_ns", "issue_ns", "complete_ns", "result")
        if n == 1 and parts[0] is not None:  # one worker's columns are the chunk's, in order
            timing = dict(zip(names, parts[0][:4]))
        else:
            timing = {name: np.full(n_rows, -1, dtype=np.int64) for name in names}
            for w, part in enumerate(parts):
                if part is not None:
                    for name, values in zip(timing, part[:4]):
                        timing[name][w::n] = values
        out = {**chunk, **timing}
        issued = timing["issue_ns"] >= 0
        if not issued.all():  # a stopped run: keep the rows that were issued
            out = {name: col[issued] for name, col in out.items()}
        if len(out["op"]):
            self.writer.write(out)
            if self.summarising:
                self.summary.add(out)
            for consumer in self.consumers:
                consumer.add(out)
        self.done += len(out["op"])
