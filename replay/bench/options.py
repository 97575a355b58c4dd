"""The options of `replay bench`'s standard tests (replay.bench.TESTS): the reviews'
run lengths, read shares and queue-depth splits, BenchOptions and the labels runs are named by.
"""
import re
from dataclasses import dataclass

from analysis import scoring
from replay.options import MAX_DEPTH
from traces.errors import ReplayError
from traces.units import YEAR_S

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
# ACT's concurrency as seed 000 ran it ("the default settings for queue and thread counts ...
# a total of 64 threads"): the queue-era ACT deals its reads round-robin to num-queues
# transaction queues, each served by threads-per-queue threads doing one synchronous read at
# a time, and times each read from when it was queued. Its act_config_helper.py writes
# num-queues 8 and threads-per-queue 8 (Aerospike's "Advanced Flash Device Sizing", the ACT 4
# guide), so at most 64 transactions are outstanding; a transaction that finds every thread
# busy waits, and that wait is in its latency. ACT 6 replaced both with service-threads
# (5 x the CPUs).
ACT_QUEUES = 8
ACT_THREADS_PER_QUEUE = 8
ACT_THREADS = ACT_QUEUES * ACT_THREADS_PER_QUEUE
# The review's search "start[s] at an unsustainably high rate (at least 150x)".
ACT_SEARCH_START = 150
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
# --op: the most of the target left unused (over-provisioned); 90 % still leaves a tenth tested.
MAX_OP = 90


# The longest any one run may be asked to last.
MAX_RUN_S = float(YEAR_S)
# --scale multiplies the longest test (seed 002's 6 h steady state) to at most MAX_RUN_S.
MAX_SCALE = MAX_RUN_S / STEADY_70_30_S
# act: 3,000 X transactions a second keep at least ~3 ns apart on the generator's clock.
MAX_MULTIPLE = 100_000
# pts: SNIA gives up after 25 rounds; more than a thousand is a typo, not a test.
MAX_ROUNDS = 1000


class BenchError(ReplayError):
    """A standard test cannot run as asked; the message says what to change."""


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
    # act: the load multiple (None: 1); with `search`, where the search starts instead of `start`
    multiple: float | None = None
    search: bool = False  # act: step down from `start` to the highest passing multiple
    start: int = ACT_SEARCH_START
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
    act_threads: int = ACT_THREADS  # act: the most I/Os outstanding (ACT's transaction threads)
    # Over-provisioning percents, one pass of the whole test each, in order (seed 003: 0 then
    # 25). A pass at P > 0 discards the whole target, then keeps every I/O, its fill's
    # included, in the first (100 - P) % (whole MiB); its runs are named opP-RUN.
    op: tuple = (0,)
    # A power meter's log, read after the runs (a meter may write it as they run) and aligned
    # to each by wall-clock time: analysis.power.read_log's path, columns, time unit and start.
    power_log: str | None = None
    power_columns: tuple | None = None  # (time, watts) column names; default Quarch's
    power_time_unit: str | None = None  # s, ms, us, ns; default the header's, else s
    power_start: float | None = None  # Unix seconds of the log's time 0; default: times are Unix

    def scaled(self, seconds: float, whole: bool = False) -> float:
        """`seconds` at this scale; whole seconds (at least 1) for per-second scoring."""
        value = seconds * self.scale
        return float(max(1, round(value))) if whole else max(value, 0.01)


def check_numbers(o: BenchOptions) -> None:
    """Raise BenchError, naming the option, for a number of `o` no test can run with: before
    the target is looked at, so nothing is written."""
    if not (0 < o.scale <= MAX_SCALE):  # nan fails too
        raise BenchError(f"--scale must be above 0 and at most {MAX_SCALE:g} (a year of the longest "
                         f"test), not {o.scale}")
    for name in ("duration_s", "window_s", "round_s", "period_s", "precondition_s", "point_s"):
        value = getattr(o, name)
        if value is not None and not 0 < value <= MAX_RUN_S:
            raise BenchError(f"--{name[:-2].replace('_', '-')} must be a number of seconds above 0 and "
                             f"at most {MAX_RUN_S:,.0f} (a year), not {value}")
    if not 0.0 <= o.read_share <= 1.0:
        raise BenchError(f"--read-share must be from 0 to 100 percent, not {o.read_share * 100:g}")
    if o.multiple is not None and not 0 < o.multiple <= MAX_MULTIPLE:
        raise BenchError(f"--multiple must be above 0 and at most {MAX_MULTIPLE:,}, not {o.multiple}")
    if o.search and o.multiple is not None and o.multiple != int(o.multiple):
        raise BenchError(f"--search steps by whole multiples, so the --multiple it starts from must "
                         f"be whole, not {o.multiple:g}")
    if not (isinstance(o.act_threads, int) and 1 <= o.act_threads <= MAX_DEPTH):
        raise BenchError(f"--act-threads must be from 1 to {MAX_DEPTH} (the engine's limit on I/Os "
                         f"in flight), not {o.act_threads}")
    for name in ("start", "step"):
        if not 1 <= getattr(o, name) <= MAX_MULTIPLE:
            raise BenchError(f"--{name} must be a whole multiple from 1 to {MAX_MULTIPLE:,}, "
                             f"not {getattr(o, name)}")
    if not 1 <= o.max_rounds <= MAX_ROUNDS:
        raise BenchError(f"--max-rounds must be from 1 to {MAX_ROUNDS}, not {o.max_rounds}")
    if o.seed < 0:
        raise BenchError(f"--seed must be 0 or more, not {o.seed}")
    if o.act_latency not in scoring.ACT_LATENCY:
        raise BenchError(f"--act-latency must be intended (the queue-era ACT) or issue "
                         f"(ACT 6), not {o.act_latency!r}")


def percent(share: float) -> int:
    return int(round(share * 100))


def size_label(size: int) -> str:
    return f"{size // KIB}k" if size % KIB == 0 else f"{size}b"


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


def check_op(value) -> int:
    """A whole percent from 0 to MAX_OP, the share of the target --op leaves unused."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not (0 <= number <= MAX_OP and number == int(number)):
        raise BenchError(f"--op takes a whole percent of the target to leave unused, from 0 to "
                         f"{MAX_OP}, not {value!r}")
    return int(number)


def op_prefix(op: int) -> str:
    """Runs of an over-provisioned pass are named op25-fill, op25-steady; the default's are not."""
    return f"op{op}-" if op else ""


def _data_label(data: str) -> str:
    return "" if data == "random" else "_" + data.replace(":", "")


def sweep_key(split, data="random") -> str:
    return split_label(split) + _data_label(data)
