"""Time order of an import: lone records with damaged times (outliers) refused or dropped,
per-file ordering with an optional reorder window, and a bounded-memory merge of several
time-ordered inputs.
"""
import itertools
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError
from traces.formats.reading import fail_at, iter_lines, line_of_row

# A gap longer than this between consecutive records is a damaged timestamp, not a pause:
# it is three times the span of the longest published block trace (Alibaba 2020, 31 days).
# One glitched record at 1.27e9 s (a Unix time among relative times) made a 40-year trace.
MAX_GAP_NS = 90 * 86400 * 10**9
# The longest run of records with damaged times that is still recognised as damage inside a
# file: one request's events in blkparse text (Q, G, I, D) can carry the same bad time.
MAX_RUN = 4


def span_text(ns) -> str:
    """A long time span in words: '40.2 years', '95.0 days'."""
    days = float(ns) / 86400e9
    return f"{days / 365.25:.1f} years" if days >= 365.25 else f"{days:.1f} days"


def outlier_error(path, line, gap_ns) -> TraceFormatError:
    return TraceFormatError(path, f"line {line}: this record's time is {span_text(gap_ns)} away "
                            f"from the records around it (more than {span_text(MAX_GAP_NS)}): a "
                            "damaged timestamp; --drop-outliers leaves such records out")


def first_record(path, parse, checker, otherwise, time_of=None, scale=1, outliers=None):
    """(line number, parse(line)) of the first line of `path`, or None for an empty file. A
    first line that `parse` refuses (None) is a TraceFormatError naming the field `checker`
    finds at fault, or saying `otherwise` when every field has the right kind.

    With `time_of` (parsed -> time, `scale` ns a unit), for a format whose times count from
    its first record: a first record that is an outlier (see Outliers) is refused, naming
    its line. With outliers.drop, a first record later than the rest gives way to the second
    as the origin; an earlier one stays the origin, and import_trace moves the times to the
    first kept record. Either way no kept time is negative.
    """
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        return None
    parsed = parse(first[1].decode("utf-8", "replace"))
    if parsed is None:
        raise TraceFormatError(path, f"line {first[0]}: {checker(first[1]) or otherwise}")
    if time_of is None:
        return first[0], parsed
    after = [(number, parse(line.decode("utf-8", "replace"))) for number, line in itertools.islice(lines, 2)]
    if len(after) < 2 or after[0][1] is None or after[1][1] is None:
        return first[0], parsed
    t0, t1, t2 = (float(time_of(p)) for p in (parsed, after[0][1], after[1][1]))
    limit = MAX_GAP_NS / scale
    if abs(t1 - t0) > limit and abs(t2 - t1) <= limit:
        if outliers is None or not outliers.drop:
            raise outlier_error(path, first[0], abs(t1 - t0) * scale)
        if t0 > t1:
            return after[0]
    return first[0], parsed


class Ordered:
    """Makes one input's chunks non-decreasing in ts_ns.

    window_ns == 0: any decrease is an error naming its line. window_ns > 0: rows are held
    back and stably sorted until they are `window_ns` older than the newest row seen, so
    small disorder (per-CPU capture interleaving) is repaired in bounded memory; a row
    arriving later than that is an error naming its line.
    """

    def __init__(self, path, window_ns=0, skip_rows=0, line_of=None, unit="line"):
        """line_of(row) -> the number errors name, after `unit` ("record" for binary files)."""
        self.path, self.window, self.skip, self.unit = path, int(window_ns), skip_rows, unit
        self.line_of = line_of or (lambda row: line_of_row(path, row, skip_rows))
        self.last = None
        self.held = None  # chunk dict plus "_row"

    def push(self, chunk, row0):
        """`chunk` may carry "_row", the data row of each of its rows (after filtering)."""
        ts = chunk["ts_ns"]
        rows = chunk.get("_row")
        if rows is None:
            rows = np.arange(row0, row0 + len(ts), dtype=np.int64)
        if self.window == 0:
            chunk = {k: v for k, v in chunk.items() if k != "_row"}
            if len(ts):
                if self.last is not None and ts[0] < self.last:
                    raise self._late(int(rows[0]), self.last, ts[0])
                if (down := ts[1:] < ts[:-1]).any():
                    i = int(down.argmax())
                    raise self._late(int(rows[i + 1]), ts[i], ts[i + 1])
                self.last = int(ts[-1])
            return chunk
        # Disorder beyond the window is an error, within a chunk as across chunks.
        newest = max([self.last if self.last is not None else ts[0] if len(ts) else 0]
                     + ([int(self.held["ts_ns"].max())] if self.held is not None and len(self.held["ts_ns"]) else []))
        in_order = self._in_order(ts, newest)
        if len(ts) and not in_order:
            lag = np.maximum.accumulate(np.maximum(ts, newest)) - ts
            if (late := lag > self.window).any():
                i = int(late.argmax())
                raise TraceFormatError(
                    self.path,
                    f"{self.unit} {self.line_of(int(rows[i]))}: time goes back by "
                    f"{lag[i] / 1e9:.6f} s, more than the reorder window of {self.window / 1e9:g} s; "
                    "is the file sorted by time?")
        chunk = dict(chunk, _row=rows)
        follows = in_order and (self.held is None or not len(self.held["ts_ns"])
                                or ts[0] >= self.held["ts_ns"][-1])
        held = chunk if self.held is None else concat([self.held, chunk])
        # Sorting only when needed: the published traces are nearly always in order already.
        if not follows and (held["ts_ns"][1:] < held["ts_ns"][:-1]).any():
            order = np.argsort(held["ts_ns"], kind="stable")
            held = {k: v[order] for k, v in held.items()}
        if not len(held["ts_ns"]):
            self.held = held
            return None
        cut = np.searchsorted(held["ts_ns"], held["ts_ns"][-1] - self.window, side="right")
        out = {k: v[:cut] for k, v in held.items()}
        self.held = {k: v[cut:] for k, v in held.items()}
        return self._emit(out)

    def _in_order(self, ts, newest) -> bool:
        """Whether `ts` rises and starts within the window of the newest row (the usual
        case): then no row is late, nor needs sorting after the held ones, and neither needs
        a pass of its own (one pass instead of five)."""
        return bool(len(ts)) and not (ts[1:] < ts[:-1]).any() and ts[0] >= newest - self.window

    def finish(self):
        if self.window == 0 or self.held is None:
            return None
        out, self.held = self.held, None
        return self._emit(out)

    def _emit(self, out):
        ts = out["ts_ns"]
        if len(ts) and self.last is not None and ts[0] < self.last:
            raise TraceFormatError(
                self.path,
                f"{self.unit} {self.line_of(int(out['_row'][0]))}: time goes back "
                f"by {(self.last - ts[0]) / 1e9:.6f} s, more than the reorder window of "
                f"{self.window / 1e9:g} s; is the file sorted by time?")
        if len(ts):
            self.last = int(ts[-1])
        out.pop("_row")
        return out

    def _late(self, row, before, after):
        return TraceFormatError(self.path, f"{self.unit} {self.line_of(row)}: time goes back (from "
                                f"{before} ns to {after} ns); this format must be sorted by time")


def ordered_chunks(path, chunks_with_rows, window_ns=0, skip_rows=0, outliers=None, scale=1):
    """Apply `Outliers` then `Ordered` to an iterator of (row0, chunk).

    `outliers`: the import's OutlierLog (None: refuse outliers); `scale`: ns per unit of
    the chunks' ts_ns, for a format whose times are still in its own unit here.
    """
    order = Ordered(path, window_ns, skip_rows)
    spikes = Outliers(path, outliers, lambda row: line_of_row(path, row, skip_rows), scale)
    for row0, chunk in chunks_with_rows:
        out = order.push(spikes.push(chunk, row0), row0)
        if out is not None and len(out["ts_ns"]):
            yield out
    rest = spikes.finish()
    out = order.push(rest, 0) if rest else None
    if out is not None and len(out["ts_ns"]):
        yield out
    out = order.finish()
    if out is not None and len(out["ts_ns"]):
        yield out


class OutlierLog:
    """What an import does with outlying records: drop them (--drop-outliers) or refuse.
    Dropped records are counted here for the trace's metadata."""

    def __init__(self, drop=False):
        self.drop = drop
        self.count = 0
        self.dropped = []  # "file:line" of the first 20

    def metadata(self) -> dict:
        return {"count": self.count, "max_gap_s": MAX_GAP_NS // 10**9, "first": self.dropped}


class Outliers:
    """Finds records whose time lies more than MAX_GAP_NS from their neighbours in file order:
    a damaged timestamp, as a record 40 years away is. Inside the file that is a lone record
    far from both neighbours, or a run of up to MAX_RUN records that leaves the others' time
    and comes back to it; at either end, one record far from its neighbour while that
    neighbour is near its own. The first one is an error naming its line; with log.drop they
    are left out and counted. MAX_RUN + 1 rows are held back, for what follows the last ones.
    """

    def __init__(self, path, log, line_of, scale=1):
        self.path, self.log, self.line_of, self.scale = path, log or OutlierLog(), line_of, scale
        self.before = None  # time of the last row kept, in the chunk's unit
        self.before_gap = np.nan  # that row's gap to the one before it
        self.pending = None  # the last rows seen, undecided

    def push(self, chunk, row0):
        if "_row" not in chunk:
            chunk = dict(chunk, _row=np.arange(row0, row0 + len(chunk["ts_ns"]), dtype=np.int64))
        if self.pending is not None:
            chunk = concat([self.pending, chunk])
        kept, decided = self._judge(chunk, max(0, len(chunk["ts_ns"]) - MAX_RUN - 1))
        self.pending = {k: v[decided:] for k, v in chunk.items()}
        return kept

    def finish(self):
        if self.pending is None:
            return {}
        chunk, self.pending = self.pending, None
        return self._judge(chunk, len(chunk["ts_ns"]))[0]

    def _judge(self, chunk, n):
        """(the first `n` rows of `chunk` or more, outliers refused or left out; how many rows
        that decided). A run that starts among the first `n` rows is decided whole."""
        if n == 0:
            return {k: v[:0] for k, v in chunk.items()}, 0
        limit = MAX_GAP_NS / self.scale
        if (quiet := self._quiet(chunk, n, limit)) is not None:
            return quiet, n
        t = chunk["ts_ns"].astype(np.float64)
        gaps = np.abs(np.diff(t))
        left = np.r_[abs(t[0] - self.before) if self.before is not None else np.nan, gaps]
        right = np.r_[gaps, np.nan]
        left_of_left = np.r_[self.before_gap, left[:-1]]
        right_of_right = np.r_[right[1:], np.nan]
        with np.errstate(invalid="ignore"):  # NaN: no neighbour there; comparisons are False
            far = (left > limit) & (right > limit)
            far |= np.isnan(left) & (right > limit) & (right_of_right <= limit)
            far |= np.isnan(right) & (left > limit) & (left_of_left <= limit)
            jumps = np.flatnonzero(left > limit)
        # A run: two jumps at most MAX_RUN rows apart, the second back to the time before the first.
        for start, end in zip(jumps[:-1].tolist(), jumps[1:].tolist()):
            back_to = t[start - 1] if start else self.before
            if start < n and 2 <= end - start <= MAX_RUN and abs(t[end] - back_to) <= limit:
                far[start:end] = True
                n = max(n, end)
        far = far[:n]
        if far.any():
            rows = chunk["_row"][:n][far]
            if not self.log.drop:
                i = int(far.argmax())
                gap = min(g for g in (left[i], right[i]) if g > limit)  # the far side
                raise outlier_error(self.path, self.line_of(int(rows[0])), gap * self.scale)
            name = Path(self.path).name
            room = max(0, 20 - len(self.log.dropped))
            self.log.dropped.extend(f"{name}:{self.line_of(int(r))}" for r in rows[:room].tolist())
            self.log.count += len(rows)
        keep = ~far
        if keep.any():
            last = int(np.flatnonzero(keep)[-1])
            self.before, self.before_gap = float(t[last]), float(left[last])
        return {k: v[:n][keep] for k, v in chunk.items()}, n

    def _quiet(self, chunk, n, limit):
        """The first `n` rows of `chunk` whole (views) when no gap among them, to the rows
        after them or to the last row kept is more than `limit` (the usual case), else None.
        Two passes, the minimum and the maximum, where _judge takes about twenty: the span
        of the chunk bounds every gap, in float64 as _judge computes them (rounding keeps
        the order)."""
        ts = chunk["ts_ns"]
        lo, hi, first = float(ts.min()), float(ts.max()), float(ts[0])
        if hi - lo > limit or (self.before is not None and abs(first - self.before) > limit):
            return None
        self.before_gap = (abs(float(ts[n - 1]) - float(ts[n - 2])) if n >= 2 else
                           abs(first - self.before) if self.before is not None else np.nan)
        self.before = float(ts[n - 1])
        return {k: v[:n] for k, v in chunk.items()}


def concat(chunks):
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def merge_sorted(streams):
    """Merge time-ordered chunk iterators into one, in bounded memory (stable by stream order).

    Rows up to the smallest newest-buffered time among live streams are safe to emit: no
    live stream can still produce an earlier row.
    """
    streams = [iter(s) for s in streams]
    if len(streams) == 1:
        yield from streams[0]
        return
    buffers = [None] * len(streams)
    live = [True] * len(streams)
    while True:
        for i, stream in enumerate(streams):
            while live[i] and (buffers[i] is None or not len(buffers[i]["ts_ns"])):
                try:
                    buffers[i] = next(stream)
                except StopIteration:
                    live[i] = False
        pending = [b for b in buffers if b is not None and len(b["ts_ns"])]
        if not pending:
            return
        marks = [buffers[i]["ts_ns"][-1] for i in range(len(streams)) if live[i]]
        mark = min(marks) if marks else np.iinfo(np.int64).max
        parts = []
        for i, b in enumerate(buffers):
            if b is None or not len(b["ts_ns"]):
                continue
            cut = int(np.searchsorted(b["ts_ns"], mark, side="right"))
            parts.append({k: v[:cut] for k, v in b.items()})
            buffers[i] = {k: v[cut:] for k, v in b.items()}
        out = concat(parts)
        order = np.argsort(out["ts_ns"], kind="stable")
        yield {k: v[order] for k, v in out.items()}


def spread_seconds(path, chunks, origin):
    """Whole seconds (chunks with "_row") -> ns from `origin` s, each second's I/Os evenly over
    it (Tencent CBS, libCacheSim's oracleGeneral); a second is held back until the next one
    starts, so a second split across chunks is spread as a whole."""
    held = None
    for chunk in chunks:
        seconds = chunk["ts_ns"]
        rows = chunk["_row"]
        if len(seconds):
            before = held["ts_ns"][-1] if held is not None and len(held["ts_ns"]) else None
            if before is not None and seconds[0] < before:
                raise fail_at(path, int(rows[0]), f"time goes back from {before} to {seconds[0]} s")
            if (down := seconds[1:] < seconds[:-1]).any():
                i = int(down.argmax())
                raise fail_at(path, int(rows[i + 1]), f"time goes back from {seconds[i]} to {seconds[i + 1]} s")
        held = chunk if held is None else concat([held, chunk])
        if not len(held["ts_ns"]):
            continue
        cut = int(np.searchsorted(held["ts_ns"], held["ts_ns"][-1], side="left"))
        if cut:
            yield _spread_seconds({k: v[:cut] for k, v in held.items()}, origin)
            held = {k: v[cut:] for k, v in held.items()}
    if held is not None and len(held["ts_ns"]):
        yield _spread_seconds(held, origin)


def _spread_seconds(chunk, origin):
    """Whole seconds (complete groups) -> ns: the k-th of n I/Os of a second at k * 1e9 // n."""
    seconds = chunk.pop("_row") is not None and chunk["ts_ns"]
    starts = np.flatnonzero(np.r_[True, seconds[1:] != seconds[:-1]])
    counts = np.diff(np.r_[starts, len(seconds)])
    group_start = np.repeat(starts, counts)
    group_size = np.repeat(counts, counts)
    rank = np.arange(len(seconds)) - group_start
    chunk["ts_ns"] = (seconds - origin) * 1_000_000_000 + rank * 1_000_000_000 // group_size
    return chunk
