"""Streaming generators of the reviewers' synthetic tests (random and sequential mixes,
preconditioning, the ACT-like load, a mix fitted to a trace), emitting common-schema chunks.

Rows are made in fixed blocks of BLOCK_ROWS; block k draws from its own random generator,
seeded from (seed, k) by numpy SeedSequence spawning, and any state (time, stream positions)
is carried from block to block. So a generator's rows depend on its seed and parameters only:
never on the chunk size asked for, and memory stays bounded whatever the run length.

Closed-loop generators (no rate) set every ts_ns to 0: they are meant for `replay run --afap
--qd N`, where the replayer keeps N I/Os in flight; their queue depth is kept as a parameter.
"""
import importlib.metadata
import math

import numba
import numpy as np
import pyarrow as pa

from traces.errors import ReplayError
from traces.kernel_types import F64, I64, ro, ro_c, rw
from traces.schema import TRACE_ARROW_SCHEMA, TRACE_COLUMNS, Op
from traces.trace import DEFAULT_CHUNK_ROWS, TraceWriter, open_trace

# Rows per random-generator block: the unit of reproducibility, not of output. Changing it
# changes every generated trace, so it is part of the format of a seed.
BLOCK_ROWS = 1 << 16
KIB = 1024
SECOND_NS = 1_000_000_000


class GeneratorError(ReplayError, ValueError):
    """A generator was given parameters it cannot honour; the message says which and why."""


def _rng(seed: int, key: tuple, block: int) -> np.random.Generator:
    # SeedSequence(seed, spawn_key=key + (k,)) is exactly the k-th child that spawn() would
    # give, made in O(1) without spawning the k - 1 before it.
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(*key, block)))
    )


def _empty_chunk() -> dict[str, np.ndarray]:
    return {name: np.empty(0, dtype=dtype) for name, dtype in TRACE_COLUMNS.items()}


def _rechunk(blocks, rows: int):
    """Re-slice a stream of chunks into chunks of exactly `rows` rows (the last may be shorter)."""
    if rows < 1:
        raise GeneratorError(f"rows must be at least 1, not {rows}")
    parts, held = [], 0
    for block in blocks:
        n = len(block["ts_ns"])
        start = 0
        while start < n:
            take = min(rows - held, n - start)
            parts.append({k: v[start:start + take] for k, v in block.items()})
            held += take
            start += take
            if held == rows:
                yield _concat(parts)
                parts, held = [], 0
    if held:
        yield _concat(parts)


def _concat(parts):
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class Generator:
    """A synthetic workload: `chunks(rows)` streams it; `parameters()` says how it was made.

    Subclasses define `name`, `_blocks()` (chunks, block k from `self._block_rng(k)`),
    `parameters()` (JSON-ready) and `span_end` (the device size the trace needs, in bytes).
    """

    name = "generator"
    closed_loop = True
    key: tuple = ()  # spawn-key prefix; Sequence gives each of its stages its own

    def chunks(self, rows: int = DEFAULT_CHUNK_ROWS):
        """Yield dicts of numpy arrays in the trace schema, `rows` rows each (the last fewer)."""
        return _rechunk(self._blocks(), int(rows))

    def __iter__(self):
        return self.chunks()

    def _block_rng(self, block: int) -> np.random.Generator:
        return _rng(self.seed, self.key, block)

    def parameters(self) -> dict:
        raise NotImplementedError

    def _blocks(self):
        raise NotImplementedError


# ---- parameters ------------------------------------------------------------------------


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise GeneratorError(f"{name} must be a positive whole number, not {value!r}")
    return int(value)


def _share(name, value):
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise GeneratorError(f"{name} must be a share between 0 and 1, not {value}")
    return value


def _size_mix(block_size) -> tuple[np.ndarray, np.ndarray]:
    """An int (one size) or a {size: weight} mapping -> (sizes int64, probabilities)."""
    if isinstance(block_size, dict):
        items = sorted(block_size.items())
        if not items:
            raise GeneratorError("the size mix is empty; give at least one size")
        sizes = np.array([_positive_int("block size", s) for s, _ in items], dtype=np.int64)
        weights = np.array([float(w) for _, w in items])
        if (weights < 0).any() or not weights.sum() > 0 or not np.isfinite(weights).all():
            raise GeneratorError(f"size mix weights must be non-negative and not all 0: {block_size}")
        return sizes, weights / weights.sum()
    return np.array([_positive_int("block size", block_size)], dtype=np.int64), np.ones(1)


def _draw_sizes(rng, sizes, probs, n):
    if len(sizes) == 1:
        return np.full(n, sizes[0], dtype=np.int64)
    return sizes[np.minimum(np.searchsorted(np.cumsum(probs), rng.random(n), side="right"),
                            len(sizes) - 1)]


def parse_distribution(spec: str) -> tuple:
    """'uniform', 'zipf:S' (S > 0) or 'hotcold:X/Y' (X % of I/Os on the first Y % of the span)."""
    kind, _, arg = str(spec).partition(":")
    try:
        if kind == "uniform" and not arg:
            return ("uniform",)
        if kind == "zipf":
            s = float(arg)
            if s > 0 and math.isfinite(s):
                return ("zipf", s)
        if kind == "hotcold":
            x, y = (float(p) for p in arg.split("/"))
            if 0 <= x <= 100 and 0 < y <= 100:
                return ("hotcold", x / 100, y / 100)
    except ValueError:
        pass
    raise GeneratorError(
        f"offset distribution {spec!r} is not one of 'uniform', 'zipf:S' with S > 0 "
        "(for example 'zipf:1.2'), 'hotcold:X/Y' (for example 'hotcold:90/10': 90 % of I/Os "
        "on 10 % of the span)"
    )


def _draw_slots(rng, dist: tuple, n_slots: int, n: int) -> np.ndarray:
    """n slot numbers in [0, n_slots) under `dist`; slot 0 is the hottest (start of the span)."""
    if dist[0] == "uniform":
        return rng.integers(0, n_slots, n, dtype=np.int64)
    if dist[0] == "zipf":
        # Bounded continuous power law with density ~ x^-s on [1, n_slots + 1), floored: the
        # usual approximation of a finite Zipf; numpy's zipf needs s > 1 and is unbounded.
        s, top = dist[1], float(n_slots) + 1.0
        u = rng.random(n)
        if abs(s - 1.0) < 1e-9:
            x = np.exp(u * math.log(top))
        else:
            x = (1.0 + u * (top ** (1.0 - s) - 1.0)) ** (1.0 / (1.0 - s))
        return np.minimum(x.astype(np.int64) - 1, n_slots - 1)
    _, io_share, span_share = dist
    hot = min(n_slots, max(1, round(n_slots * span_share)))
    slots = rng.integers(0, hot, n, dtype=np.int64)
    if hot < n_slots:
        cold = rng.random(n) >= io_share
        slots[cold] = rng.integers(hot, n_slots, int(cold.sum()), dtype=np.int64)
    return slots


@numba.njit((rw(I64), ro(I64), ro(F64), F64, I64, I64, I64, I64), nogil=True, cache=True)
def _continue_runs(offset, length, draw, p, prev_end, align, lo, hi):
    """Where draw[i] < p, I/O i starts where the previous one ended (rounded up to `align`)
    if it fits below `hi`; otherwise it keeps its random offset. Returns the last end.

    A per-row loop: each decision depends on the previous row's end. Its inputs are of any
    layout (`ro`): with C-contiguous ones (`ro_c`, as every other kernel's) it took 1.13-1.17x
    as long (0.39 against 0.34 ms per 65,536 rows, bench/kernel_layout.py, three runs).
    """
    for i in range(offset.shape[0]):
        if draw[i] < p and prev_end >= lo:
            start = (prev_end + align - 1) // align * align
            if start + length[i] <= hi:
                offset[i] = start
        prev_end = offset[i] + length[i]
    return prev_end


@numba.njit((I64, rw(I64), rw(I64), rw(I64), ro_c(I64), I64), nogil=True, cache=True)
def _stream_offsets(first_row, length, offset, position, region, region_size):
    """Row r belongs to stream r mod S; each stream writes its region front to back and wraps.
    An I/O that would cross its region's end is cut short there, so each pass covers the
    region exactly. Fills offset, may shorten length, advances position in place."""
    streams = position.shape[0]
    for i in range(length.shape[0]):
        s = (first_row + i) % streams
        pos = position[s]
        n = min(length[i], region_size - pos)
        offset[i] = region[s] + pos
        length[i] = n
        pos += n
        position[s] = 0 if pos >= region_size else pos


# ---- the mixes ---------------------------------------------------------------------------


class Mix(Generator):
    """Common part of random and sequential mixes: ops, sizes, timing and termination.

    Timing: `rate` None is closed loop (ts_ns 0, for --afap with `queue_depth` in flight);
    otherwise open loop at `rate` I/Os per second, `arrival` "constant" (I/O i at i / rate)
    or "poisson" (exponential gaps). It ends after `count` I/Os or, open loop, at the first
    I/O due at or after `duration_s`; given both, whichever comes first. Closed loop needs
    `count` (a duration alone cannot say how many I/Os a device will do), or `unbounded`:
    no end at all, for a replay stopped by its time limit (`replay bench`); the runner then
    knows it has no length, rather than taking a huge count for one.
    """

    def __init__(self, *, block_size, read_share, span, span_start, align, rate, arrival,
                 count, duration_s, queue_depth, seed, unbounded=False):
        self.sizes, self.size_probs = _size_mix(block_size)
        self.block_size = block_size
        self.read_share = _share("read share", read_share)
        self.span = _positive_int("span", span)
        self.span_start = int(span_start)
        if self.span_start < 0:
            raise GeneratorError(f"span start must be 0 or more bytes, not {span_start}")
        self.align = _positive_int("alignment", align)
        if self.span_start % self.align:
            raise GeneratorError(
                f"span start {self.span_start} is not a multiple of the alignment {self.align}"
            )
        if int(self.sizes.max()) > self.span:
            raise GeneratorError(
                f"the largest I/O ({int(self.sizes.max())} bytes) does not fit in the span "
                f"({self.span} bytes); give a larger span or smaller blocks"
            )
        self.rate = None if rate is None else float(rate)
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise GeneratorError(f"rate must be a positive number of I/Os per second, not {rate}")
        if arrival not in ("constant", "poisson"):
            raise GeneratorError(f"arrival must be 'constant' or 'poisson', not {arrival!r}")
        self.arrival = arrival
        self.count = None if count is None else int(count)
        if self.count is not None and self.count < 0:
            raise GeneratorError(f"count must be 0 or more I/Os, not {count}")
        self.duration_s = None if duration_s is None else float(duration_s)
        if self.duration_s is not None and not self.duration_s >= 0:
            raise GeneratorError(f"duration must be 0 or more seconds, not {duration_s}")
        self.unbounded = bool(unbounded)
        if self.unbounded and (self.count is not None or rate is not None):
            raise GeneratorError("an unbounded mix is closed loop with no count: it runs until "
                                 "the replay's time limit stops it")
        if self.count is None and not self.unbounded and (self.rate is None or self.duration_s is None):
            raise GeneratorError(
                "give count (I/Os), or a rate and a duration: a closed-loop run needs a count"
            )
        self.closed_loop = self.rate is None
        self.queue_depth = _positive_int("queue depth", queue_depth)
        self.seed = int(seed)

    @property
    def span_end(self) -> int:
        return self.span_start + self.span

    def _common_parameters(self) -> dict:
        sizes = (
            {str(k): float(v) for k, v in sorted(self.block_size.items())}
            if isinstance(self.block_size, dict) else int(self.block_size)
        )
        return {
            "block_size": sizes, "read_share": self.read_share, "span": self.span,
            "span_start": self.span_start, "align": self.align, "rate": self.rate,
            "arrival": self.arrival if self.rate is not None else "closed",
            "count": self.count, "duration_s": self.duration_s,
            "queue_depth": self.queue_depth, "seed": self.seed,
        }

    def _blocks(self):
        state = self._initial_state()
        clock = 0.0  # ns, the time of the last Poisson arrival so far
        limit_ns = None if self.duration_s is None else self.duration_s * SECOND_NS
        row, block = 0, 0
        while self.count is None or row < self.count:
            n = BLOCK_ROWS if self.count is None else min(BLOCK_ROWS, self.count - row)
            rng = self._block_rng(block)
            if self.rate is None:
                ts = np.zeros(n, dtype=np.int64)
            elif self.arrival == "constant":
                ts = (np.arange(row, row + n, dtype=np.float64) * (SECOND_NS / self.rate)).astype(np.int64)
            else:
                times = clock + np.cumsum(rng.exponential(SECOND_NS / self.rate, n))
                clock = float(times[-1])
                ts = times.astype(np.int64)
            last = False
            if limit_ns is not None and self.rate is not None and n and ts[-1] >= limit_ns:
                n = int(np.searchsorted(ts, limit_ns, side="left"))
                ts, last = ts[:n], True
            op = np.where(rng.random(n) < self.read_share, Op.READ, Op.WRITE).astype(np.uint8)
            length = _draw_sizes(rng, self.sizes, self.size_probs, n)
            offset = self._offsets(rng, row, length, state)
            yield {"ts_ns": ts, "op": op, "offset": offset, "length": length}
            row += n
            block += 1
            if last:
                return


class RandomMix(Mix):
    """Random I/O over [span_start, span_start + span): offsets are multiples of `align` placed
    so the largest size fits, drawn by `distribution` ('uniform', 'zipf:S', 'hotcold:X/Y';
    slot 0, the start of the span, is the hottest). With `sequential_share` p > 0, each I/O
    instead continues where the previous one ended with probability p (how a fitted mix
    reproduces a trace's sequentiality)."""

    name = "random"

    def __init__(self, *, block_size=4096, read_share=0.7, span=8 << 30, span_start=0,
                 align=None, distribution="uniform", sequential_share=0.0, rate=None,
                 arrival="poisson", count=None, duration_s=None, queue_depth=32, seed=0,
                 unbounded=False):
        if align is None:  # the largest power of two up to 4 KiB that divides no more than a size
            align = 1 << (int(min(4096, _size_mix(block_size)[0].min())).bit_length() - 1)
        super().__init__(block_size=block_size, read_share=read_share, span=span,
                         span_start=span_start, align=align, rate=rate, arrival=arrival,
                         count=count, duration_s=duration_s, queue_depth=queue_depth, seed=seed,
                         unbounded=unbounded)
        self.distribution = str(distribution)
        self._dist = parse_distribution(distribution)
        self.sequential_share = _share("sequential share", sequential_share)
        self.n_slots = (self.span - int(self.sizes.max())) // self.align + 1

    def parameters(self):
        return {**self._common_parameters(), "distribution": self.distribution,
                "sequential_share": self.sequential_share}

    def _initial_state(self):
        return {"prev_end": -1}

    def _offsets(self, rng, row, length, state):
        offset = self.span_start + _draw_slots(rng, self._dist, self.n_slots, len(length)) * self.align
        if self.sequential_share > 0:
            draw = rng.random(len(length))
            state["prev_end"] = _continue_runs(
                offset, length, draw, self.sequential_share, state["prev_end"], self.align,
                self.span_start, self.span_end,
            )
        return offset


class SequentialMix(Mix):
    """Sequential I/O in `streams` streams; the span is split into that many equal regions
    (each a multiple of `align`), row r goes to stream r mod streams, and each stream runs
    through its region front to back and wraps. The I/O reaching a region's end is cut short
    there, so every pass covers its region exactly once."""

    name = "sequential"

    def __init__(self, *, block_size=128 * KIB, read_share=0.7, span=8 << 30, span_start=0,
                 streams=1, align=4096, rate=None, arrival="poisson", count=None,
                 duration_s=None, queue_depth=1, seed=0, unbounded=False):
        super().__init__(block_size=block_size, read_share=read_share, span=span,
                         span_start=span_start, align=align, rate=rate, arrival=arrival,
                         count=count, duration_s=duration_s, queue_depth=queue_depth, seed=seed,
                         unbounded=unbounded)
        self.streams = _positive_int("streams", streams)
        self.region_size = self.span // self.streams // self.align * self.align
        if self.region_size < 1:
            raise GeneratorError(
                f"a span of {self.span} bytes cannot hold {self.streams} streams aligned to "
                f"{self.align} bytes; give fewer streams or a larger span"
            )

    def parameters(self):
        return {**self._common_parameters(), "streams": self.streams}

    def _initial_state(self):
        return {"position": np.zeros(self.streams, dtype=np.int64),
                "region": self.span_start + np.arange(self.streams, dtype=np.int64) * self.region_size}

    def _offsets(self, rng, row, length, state):
        offset = np.empty(len(length), dtype=np.int64)
        _stream_offsets(row, length, offset, state["position"], state["region"], self.region_size)
        return offset


def random_mix(**parameters) -> RandomMix:
    """See RandomMix: 4 KiB random, 70 % reads over 8 GiB by default."""
    return RandomMix(**parameters)


def sequential_mix(**parameters) -> SequentialMix:
    """See SequentialMix: 128 KiB sequential, 70 % reads, one stream, by default."""
    return SequentialMix(**parameters)


# ---- preconditioning ------------------------------------------------------------------------


class Purge(Generator):
    """One discard of the whole span: the purge that SNIA PTS starts from."""

    name = "purge"

    def __init__(self, *, span, span_start=0, seed=0):
        self.span, self.span_start, self.seed = _positive_int("span", span), int(span_start), int(seed)

    @property
    def span_end(self):
        return self.span_start + self.span

    def parameters(self):
        return {"span": self.span, "span_start": self.span_start}

    def _blocks(self):
        yield {"ts_ns": np.zeros(1, np.int64), "op": np.array([Op.DISCARD], np.uint8),
               "offset": np.array([self.span_start], np.int64), "length": np.array([self.span], np.int64)}


class Sequence(Generator):
    """Closed-loop stages one after the other; each stage draws from its own seed key."""

    name = "sequence"

    def __init__(self, name, stages, seed=0):
        self.name, self.stages, self.seed = name, list(stages), int(seed)
        for i, stage in enumerate(self.stages):
            if not stage.closed_loop:
                raise GeneratorError(
                    f"stage {i} ({stage.name}) is open loop; a sequence joins closed-loop stages"
                )
            stage.key = (*self.key, i)

    @property
    def span_end(self):
        return max(stage.span_end for stage in self.stages)

    def parameters(self):
        return {"seed": self.seed,
                "stages": [{"name": s.name, **s.parameters()} for s in self.stages]}

    def _blocks(self):
        for stage in self.stages:
            yield from stage._blocks()


def sequential_fill(*, span, span_start=0, passes=1, block_size=128 * KIB, queue_depth=32,
                    seed=0) -> SequentialMix:
    """`passes` passes of sequential writes (128 KiB) over the span, closed loop."""
    passes = _positive_int("passes", passes)
    size = _positive_int("block size", block_size)
    per_pass = -(-_positive_int("span", span) // size)
    align = math.gcd(size, span, 4096)
    gen = SequentialMix(block_size=size, read_share=0.0, span=span, span_start=span_start,
                        align=align, count=passes * per_pass, queue_depth=queue_depth, seed=seed)
    gen.name = "fill"
    return gen


def precondition(*, span, span_start=0, passes=1, random_writes=None, queue_depth=32,
                 seed=0) -> Sequence:
    """Sequential fill (`passes` x 128 KiB writes over the span), then `random_writes` random
    4 KiB writes (default: one span's worth), all closed loop."""
    if random_writes is None:
        random_writes = span // 4096
    stages = [
        sequential_fill(span=span, span_start=span_start, passes=passes,
                        queue_depth=queue_depth, seed=seed),
        RandomMix(block_size=4096, read_share=0.0, span=span, span_start=span_start,
                  count=random_writes, queue_depth=queue_depth, seed=seed),
    ]
    return Sequence("precondition", stages, seed=seed)


def snia_purge_fill(*, span, span_start=0, queue_depth=32, seed=0) -> Sequence:
    """SNIA PTS preconditioning: purge (discard the span), then write it twice with 128 KiB
    sequential writes."""
    stages = [Purge(span=span, span_start=span_start, seed=seed),
              sequential_fill(span=span, span_start=span_start, passes=2,
                              queue_depth=queue_depth, seed=seed)]
    return Sequence("snia-purge-fill", stages, seed=seed)


# ---- ACT-like load --------------------------------------------------------------------------


class ActLoad(Generator):
    """The load of Aerospike's ACT (act_storage) at a multiple X, open loop.

    Per second: 2,000 X small reads of `record_bytes` (1.5 KiB) records, their length rounded
    UP to the device's logical block (`device_block`: 1,536 bytes stay 1,536 on a 512-byte
    device, become 4,096 on a 4 KiB one) and their offset a random multiple of it; and
    1,000 X record writes, buffered as ACT does into `large_block` (128 KiB) writes, with
    defragmentation multiplying the large-block writes by `defrag_factor` (2: ACT's default
    defrag-lwm-pct of 50 %) and adding one large-block read per large-block write. So there
    are W = 1,000 X x record_bytes / large_block x defrag_factor large-block writes per second
    and as many large-block reads, at random large-block-aligned offsets. Transactions, which
    ACT scores, are the small reads (length <= large_block / 2, see `transaction_max_length`).

    `arrival` "even" paces as ACT does: each of the three streams (small reads, large-block
    writes, large-block reads) on its own even schedule, I/O i of a stream at rate r due at
    i / r, the streams merged by due time; the engine issues them asynchronously, so a
    large-block I/O never holds a small read back, as ACT's own large-block threads do not.
    "poisson" draws all three as one Poisson process, burstier than ACT (borderline
    multiples fail sooner).
    """

    name = "act"
    closed_loop = False

    def __init__(self, *, multiple, span, duration_s, span_start=0, record_bytes=1536,
                 device_block=512, large_block=128 * KIB, reads_per_s=2000.0,
                 writes_per_s=1000.0, defrag_factor=2.0, arrival="even", seed=0):
        if arrival not in ("even", "poisson"):
            raise GeneratorError(f"ACT arrival must be 'even' or 'poisson', not {arrival!r}")
        self.arrival = arrival
        self.multiple = float(multiple)
        if not (self.multiple > 0 and math.isfinite(self.multiple)):
            raise GeneratorError(f"the load multiple must be a positive number, not {multiple}")
        self.span = _positive_int("span", span)
        self.span_start = int(span_start)
        self.duration_s = float(duration_s)
        if not self.duration_s >= 0:
            raise GeneratorError(f"duration must be 0 or more seconds, not {duration_s}")
        self.record_bytes = _positive_int("record size", record_bytes)
        self.device_block = _positive_int("device block", device_block)
        self.large_block = _positive_int("large block", large_block)
        if self.large_block % self.device_block or self.span_start % self.large_block:
            raise GeneratorError(
                "the large block must be a multiple of the device block, and the span start "
                "a multiple of the large block"
            )
        self.read_length = -(-self.record_bytes // self.device_block) * self.device_block
        if self.read_length * 2 > self.large_block:
            raise GeneratorError("records must be under half a large block to tell them apart")
        if self.span < self.large_block:
            raise GeneratorError(f"the span must hold one large block ({self.large_block} bytes)")
        self.reads_per_s, self.writes_per_s = float(reads_per_s), float(writes_per_s)
        self.defrag_factor = float(defrag_factor)
        self.small_read_rate = self.reads_per_s * self.multiple
        self.large_write_rate = (self.writes_per_s * self.multiple * self.record_bytes
                                 / self.large_block * self.defrag_factor)
        self.large_read_rate = self.large_write_rate
        self.rate = self.small_read_rate + self.large_write_rate + self.large_read_rate
        self.seed = int(seed)

    @property
    def span_end(self):
        return self.span_start + self.span

    @property
    def transaction_max_length(self) -> int:
        """Reads up to this length are ACT transactions; large-block reads are longer."""
        return self.large_block // 2

    def parameters(self):
        return {
            "multiple": self.multiple, "span": self.span, "span_start": self.span_start,
            "duration_s": self.duration_s, "record_bytes": self.record_bytes,
            "device_block": self.device_block, "read_length": self.read_length,
            "large_block": self.large_block, "reads_per_s": self.reads_per_s,
            "writes_per_s": self.writes_per_s, "defrag_factor": self.defrag_factor,
            "small_read_rate": self.small_read_rate, "large_write_rate": self.large_write_rate,
            "large_read_rate": self.large_read_rate, "arrival": self.arrival, "seed": self.seed,
        }

    def _blocks(self):
        return self._even_blocks() if self.arrival == "even" else self._poisson_blocks()

    def _even_blocks(self):
        """Time slices of about BLOCK_ROWS I/Os; stream s has I/Os ceil(t0 r_s)..ceil(t1 r_s) - 1
        in slice [t0, t1), so slices neither repeat nor skip one."""
        limit_ns = int(self.duration_s * SECOND_NS)
        small_slots = (self.span - self.read_length) // self.device_block + 1
        large_slots = self.span // self.large_block
        slice_ns = max(1, int(BLOCK_ROWS / self.rate * SECOND_NS))
        streams = ((self.small_read_rate, Op.READ, True), (self.large_write_rate, Op.WRITE, False),
                   (self.large_read_rate, Op.READ, False))
        block = 0
        while block * slice_ns < limit_ns:
            t0, t1 = block * slice_ns, min((block + 1) * slice_ns, limit_ns)
            rng = self._block_rng(block)
            parts = []
            for rate, op, small in streams:
                first = math.ceil(t0 * rate / SECOND_NS)
                end = math.ceil(t1 * rate / SECOND_NS)
                i = np.arange(first, end, dtype=np.float64)
                ts = np.clip((i * (SECOND_NS / rate)).astype(np.int64), t0, t1 - 1)
                n = len(ts)
                if small:
                    offset = rng.integers(0, small_slots, n, dtype=np.int64) * self.device_block
                else:
                    offset = rng.integers(0, large_slots, n, dtype=np.int64) * self.large_block
                parts.append((ts, np.full(n, op, np.uint8), offset + self.span_start,
                              np.full(n, self.read_length if small else self.large_block, np.int64)))
            ts = np.concatenate([p[0] for p in parts])
            order = np.argsort(ts, kind="stable")
            yield {"ts_ns": ts[order], "op": np.concatenate([p[1] for p in parts])[order],
                   "offset": np.concatenate([p[2] for p in parts])[order],
                   "length": np.concatenate([p[3] for p in parts])[order]}
            block += 1

    def _poisson_blocks(self):
        limit_ns = self.duration_s * SECOND_NS
        small_slots = (self.span - self.read_length) // self.device_block + 1
        large_slots = self.span // self.large_block
        p_small = self.small_read_rate / self.rate
        p_write = self.large_write_rate / self.rate
        clock, block = 0.0, 0
        while True:
            rng = self._block_rng(block)
            times = clock + np.cumsum(rng.exponential(SECOND_NS / self.rate, BLOCK_ROWS))
            clock = float(times[-1])
            ts = times.astype(np.int64)
            n = int(np.searchsorted(ts, limit_ns, side="left"))
            ts = ts[:n]
            kind = rng.random(n)
            small = kind < p_small
            write = ~small & (kind < p_small + p_write)
            op = np.where(write, Op.WRITE, Op.READ).astype(np.uint8)
            length = np.where(small, self.read_length, self.large_block).astype(np.int64)
            offset = np.where(
                small,
                rng.integers(0, small_slots, n, dtype=np.int64) * self.device_block,
                rng.integers(0, large_slots, n, dtype=np.int64) * self.large_block,
            ) + self.span_start
            yield {"ts_ns": ts, "op": op, "offset": offset, "length": length}
            if n < BLOCK_ROWS:
                return
            block += 1


def act_load(**parameters) -> ActLoad:
    """See ActLoad."""
    return ActLoad(**parameters)


# ---- fit from a trace -----------------------------------------------------------------------

MAX_FITTED_SIZES = 32


def fit_trace(path, *, seed=0, count=None, duration_s=None, queue_depth=32):
    """Measure a trace (streamed) and return (a RandomMix with its figures, the figures).

    Figures over its reads and writes: read share, size mix (the MAX_FITTED_SIZES most common
    sizes), sequentiality (share of I/Os starting where the previous read or write ended),
    arrival rate (reads and writes per second of trace time; closed loop if every ts_ns is
    equal), span (largest offset + length) and alignment (largest power of two dividing every
    offset, at most the smallest size's). Flushes and discards are counted, not modelled.
    Offsets are uniform: the fitted mix has the trace's sequentiality, not its locality.
    By default it has as many I/Os as the trace's reads and writes.
    """
    trace = open_trace(path)
    reads = writes = others = 0
    sizes: dict[int, int] = {}
    sequential = 0
    prev_end = None
    first_ts = last_ts = None
    span_end = 0
    offset_bits = 0
    for chunk in trace.chunks(["ts_ns", "op", "offset", "length"]):
        if len(chunk["ts_ns"]):
            first_ts = int(chunk["ts_ns"][0]) if first_ts is None else first_ts
            last_ts = int(chunk["ts_ns"][-1])
        rw = (chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE)
        others += int((~rw).sum())
        op, offset, length = chunk["op"][rw], chunk["offset"][rw], chunk["length"][rw]
        if not len(op):
            continue
        n_read = int((op == Op.READ).sum())
        reads += n_read
        writes += len(op) - n_read
        values, counts = np.unique(length, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist()):
            sizes[v] = sizes.get(v, 0) + c
        end = offset + length
        previous = np.concatenate([[-1 if prev_end is None else prev_end], end[:-1]])
        sequential += int((offset == previous).sum())
        prev_end = int(end[-1])
        span_end = max(span_end, int(end.max()))
        offset_bits |= int(np.bitwise_or.reduce(offset))
    total = reads + writes
    if total == 0:
        raise GeneratorError(f"{path}: the trace has no reads or writes to fit a mix to")
    common = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_FITTED_SIZES]
    covered = sum(c for _, c in common)
    mix = {int(s): c / covered for s, c in common}
    smallest = min(mix)
    align_cap = 1 << (smallest.bit_length() - 1)  # largest power of two <= smallest size
    align = min(offset_bits & -offset_bits if offset_bits else align_cap, align_cap)
    elapsed_ns = (last_ts - first_ts) if total > 1 else 0
    rate = total * SECOND_NS / elapsed_ns if elapsed_ns > 0 else None
    figures = {
        "source_path": str(trace.path), "ios": total, "others": others,
        "read_share": reads / total, "size_mix": {str(k): v for k, v in mix.items()},
        "size_mix_coverage": covered / total, "sequential_share": sequential / total,
        "rate": rate, "span": span_end, "align": align,
    }
    if count is None and duration_s is None:
        count = total
    if count is None and rate is None:
        raise GeneratorError(f"{path}: the trace has no duration; give a count to fit a closed loop")
    generator = RandomMix(
        block_size=mix, read_share=reads / total, span=span_end, align=align,
        sequential_share=sequential / total, rate=rate, arrival="poisson", count=count,
        duration_s=duration_s, queue_depth=queue_depth, seed=seed,
    )
    generator.name = "fit"
    generator.fitted = figures
    return generator, figures


# ---- writing ----------------------------------------------------------------------------------


def _tool_version() -> str:
    try:
        return importlib.metadata.version("tracereplay")
    except importlib.metadata.PackageNotFoundError:
        return "source tree"


def to_trace(generator: Generator, path, metadata: dict | None = None, rows: int = 1 << 20):
    """Write `generator` to a Parquet trace at `path`, streaming (memory bounded by `rows`).

    Metadata: source kind "synth:<name>" with the generator's class and every parameter,
    device_size from its span, and a description unless `metadata` gives one; `metadata`
    keys override. The file appears only when complete.
    """
    params = generator.parameters()
    fitted = getattr(generator, "fitted", None)
    source = {"kind": f"synth:{generator.name}",
              "generator": f"{type(generator).__module__}.{type(generator).__qualname__}",
              "parameters": params, "tool_version": _tool_version()}
    if fitted is not None:
        source["fitted_from"] = fitted
    loop = "closed loop (every ts_ns 0: replay with --afap)" if generator.closed_loop else "open loop"
    base = {
        "name": generator.name,
        "description": f"SYNTHETIC {generator.name} workload made by synth.generators, {loop}.",
        "source": source,
        "device_size": int(generator.span_end),
        "provenance": "Generated from seeded numpy random generators; no real system traced.",
    }
    fields = [(f.name, f.type) for f in TRACE_ARROW_SCHEMA]
    assert [n for n, _ in fields] == list(TRACE_COLUMNS) and all(
        t == pa.from_numpy_dtype(TRACE_COLUMNS[n]) for n, t in fields)
    with TraceWriter(path, fields, {**base, **(metadata or {})}) as writer:
        for chunk in generator.chunks(rows):
            writer.write(chunk)
    return writer.path
