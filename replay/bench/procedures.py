"""What each standard test runs, in order, on a Bench: mix and seqmix sweeps, the steady
run, ACT's load (and its search), SNIA PTS's rounds; and what a PTS purge is on a target.
"""
import math

from analysis import scoring
from replay.bench.options import (ACT_PERIOD_S, FILL_BLOCK, KIB, MIX_POINT_S, MIX_SPLITS,
                                  PTS_BLOCK_SIZES, PTS_ELEMENT_S, PTS_LATENCY_BLOCK_SIZES,
                                  PTS_LATENCY_READ_SHARES, PTS_READ_SHARES, PURGE_PIECE,
                                  READ_SHARES, ROUND_S, SECOND_NS, SIX_SHARES, STEADY_S,
                                  BenchError, percent, size_label, sweep_key)
from replay.bench.scores import act_scores, lateness_report, pts_rounds, steady_scores, table_row
from synth import generators as g


def mix_sweeps(bench) -> list:
    """(split, read shares, data pattern) per sweep, in the order run: queue-depth split
    outermost, then data pattern, then read share."""
    o = bench.options
    if o.sweeps:
        return [(tuple(split), tuple(shares), data) for split, shares, data in o.sweeps]
    shares = tuple(o.read_shares or READ_SHARES)
    return [(tuple(split), shares, data) for split in (o.qd_splits or MIX_SPLITS)
            for data in o.data]

def mix(bench):
    o = bench.options
    point_s = o.duration_s or o.scaled(MIX_POINT_S)
    table = bench.scores.setdefault("table", [])
    sweeps = mix_sweeps(bench)
    for i, ((workers, qd), shares, data) in enumerate(sweeps):
        key = sweep_key((workers, qd), data)
        bench.fill(f"fill{i + 1}-{key}" if len(sweeps) > 1 else "fill")  # before each sweep
        rows = []
        for share in shares:
            name = f"{key}-r{percent(share)}"
            gen = g.random_mix(block_size=4 * KIB, read_share=share, span=bench.span,
                               unbounded=True, queue_depth=qd * workers, seed=o.seed)
            outcome = bench.run_one(name, "measure", gen, qd=qd, workers=workers,
                                   time_limit_s=point_s, data=data)
            rows.append(table_row(name, share, qd, workers, outcome.summary, data))
            table.append(rows[-1])
            sweep_scores(bench, key, rows, len(shares))

def sweep_scores(bench, key, rows, planned=None):
    """Score keys name the split (and a data pattern other than random): iops_70_30_1x32
    is one worker at QD32, iops_70_30_32x1 32 workers at QD1 (seed 000's "QD32")."""
    for row in rows:
        if row["read_share"] == 0.7:
            bench.scores[f"iops_70_30_{key}"] = row["iops"]
            bench.scores[f"mb_per_s_70_30_{key}"] = row["mb_per_s"]
    if (planned or len(rows)) < len(SIX_SHARES):  # single points (seed 004's) are scores
        for row in rows:
            bench.scores[f"mb_per_s_r{percent(row['read_share'])}_{key}"] = row["mb_per_s"]
    six = [r["mb_per_s"] for r in rows if r["read_share"] in SIX_SHARES]
    if len(six) == len(SIX_SHARES):  # seed 001's bar: the average of the six mixes
        bench.scores[f"mb_per_s_average_{key}"] = sum(six) / len(six)

def seqmix(bench):
    o = bench.options
    point_s = o.duration_s or o.scaled(MIX_POINT_S)
    bench.fill()
    table = bench.scores.setdefault("table", [])
    data = o.data[0]
    for share in tuple(o.read_shares or READ_SHARES):
        name = f"seq-r{percent(share)}"
        gen = g.sequential_mix(block_size=128 * KIB, read_share=share, span=bench.span,
                               unbounded=True, queue_depth=1, seed=o.seed)
        outcome = bench.run_one(name, "measure", gen, qd=1, time_limit_s=point_s, data=data)
        table.append(table_row(name, share, 1, 1, outcome.summary, data))
    sweep_scores(bench, "1x1", table)

def precondition(bench):
    """One sequential fill of the target, then, with --precondition S, more sequential
    writes wrapping round it until S seconds of them have run in all (seed 002: 2 h)."""
    o = bench.options
    if not o.fill:
        return
    bench.fill()
    if o.precondition_s is None:
        return
    total = o.precondition_s
    done = bench.runs[-1]["summary"]["duration_ns"] / SECOND_NS if bench.runs else 0.0
    if total > done:
        gen = g.sequential_mix(block_size=FILL_BLOCK, read_share=0.0, span=bench.fill_span,
                               align=math.gcd(FILL_BLOCK, bench.fill_span, 4096),
                               unbounded=True, queue_depth=32, seed=o.seed)
        bench.run_one("precondition", "precondition", gen, qd=32, time_limit_s=total - done)

def steady(bench):
    o = bench.options
    duration = o.duration_s or o.scaled(STEADY_S, whole=True)
    # The window and rounds keep their share of the run: --duration alone shortens the test as
    # --scale does, not to fewer than the five rounds the steady-state check needs.
    share = o.duration_s / STEADY_S if o.duration_s else o.scale
    window = o.window_s or float(max(1, round(scoring.CONSISTENCY_WINDOW_S * share)))
    round_s = o.round_s or float(max(1, round(ROUND_S * share)))
    precondition(bench)
    bins = scoring.consistency_bins()
    gen = g.random_mix(block_size=4 * KIB, read_share=o.read_share, span=bench.span,
                       unbounded=True, queue_depth=32, seed=o.seed)
    bench.scores["read_share"] = o.read_share
    try:
        bench.run_one("steady", "measure", gen, qd=32, time_limit_s=duration, consumers=[bins],
                     data=o.data[0])
    finally:  # an interrupted run is scored up to where it stopped
        stop_ns = int(duration * SECOND_NS) if not bench.runs[-1:] or not bench.runs[-1]["interrupted"] \
            else None
        bench.scores.update(steady_scores(bins, window, round_s, None, stop_ns))
    point_s = o.point_s or o.scaled(MIX_POINT_S)
    if o.qd_scaling:  # seed 002: queue-depth scaling on the drive as the 6 h left it
        rows = bench.scores["qd_scaling"] = []
        for qd in o.qd_scaling:
            gen = g.random_mix(block_size=4 * KIB, read_share=o.read_share, span=bench.span,
                               unbounded=True, queue_depth=qd, seed=o.seed)
            name = f"qd{qd}-r{percent(o.read_share)}"
            outcome = bench.run_one(name, "measure", gen, qd=qd, time_limit_s=point_s,
                                   data=o.data[0])
            rows.append(table_row(name, o.read_share, qd, 1, outcome.summary, o.data[0]))
    if o.read_shares:  # then the read-share sweep at QD32
        rows = bench.scores["table"] = []
        for share in o.read_shares:
            gen = g.random_mix(block_size=4 * KIB, read_share=share, span=bench.span,
                               unbounded=True, queue_depth=32, seed=o.seed)
            name = f"1x32-r{percent(share)}"
            outcome = bench.run_one(name, "measure", gen, qd=32, time_limit_s=point_s,
                                   data=o.data[0])
            rows.append(table_row(name, share, 32, 1, outcome.summary, o.data[0]))
        sweep_scores(bench, "1x32", rows)

def act(bench):
    o = bench.options
    duration = o.duration_s or o.scaled(ACT_PERIOD_S, whole=True)
    period = o.period_s or o.scaled(ACT_PERIOD_S, whole=True)
    bench.scores["periods"] = []

    span = bench.span // (128 * KIB) * (128 * KIB)
    bench.scores["latency_definition"] = scoring.ACT_LATENCY[o.act_latency]
    if o.act_prep:  # act_prep: zeros over the whole device, then random data, once
        for data in ("zeros", "random"):
            bench.run_one(f"act-prep-{data}", "precondition",
                         g.sequential_fill(span=bench.fill_span, block_size=FILL_BLOCK,
                                           seed=o.seed), data=data)

    def attempt(multiple):
        gen = g.act_load(multiple=multiple, span=span, duration_s=duration,
                         device_block=bench.target.logical_block_size, seed=o.seed)
        bins = scoring.act_bins(gen.transaction_max_length, latency_from=o.act_latency)
        late = scoring.act_bins(gen.transaction_max_length, latency_from="lateness")
        watch = scoring.ActWatch(gen.rate, gen.transaction_max_length)
        # Open loop at the load's own times; an overloaded target falls behind, and what
        # is still unissued well after the end (the grace) fails the run, unless ACT's
        # own early stop (ActWatch) gave up on it first.
        grace = max(5.0, duration / 2)
        gave_up = None
        try:  # at most ACT's transaction threads' worth outstanding, the rest waiting in order
            bench.run_one(f"act-x{multiple:g}", "measure", gen, afap=False, qd=1,
                         max_inflight=o.act_threads, time_limit_s=duration + grace,
                         consumers=[bins, late, watch])
        except scoring.ActGaveUp as e:
            gave_up = str(e)
        finally:
            verdict = act_scores(bins, period, duration)
            if gave_up:
                verdict.update(passed=False, reason=f"ACT gave up: {gave_up}")
            lateness = lateness_report(late, period, duration)
            if lateness["warning"]:
                bench.notices.append(f"x{multiple:g}: {lateness['warning']}")
            bench.scores["periods"].append({"multiple": multiple, **verdict,
                                           "gave_up": gave_up, "lateness": lateness})
        return verdict["passed"]

    bench.scores["act_threads"] = o.act_threads
    if o.search:
        # --multiple, when given, is where the search starts (the review started at 150x).
        start = int(o.multiple) if o.multiple is not None else o.start
        bench.scores.update(tried=[], search_start=start,
                            search_start_from="multiple" if o.multiple is not None else "start")
        search = scoring.act_search(lambda m: record_try(bench, m, attempt(m)),
                                    start=start, step=o.step)
        bench.scores.update(act_multiple=search.score, passed=search.score > 0,
                           at_start=search.at_start)
    else:
        multiple = 1.0 if o.multiple is None else o.multiple
        passed = attempt(multiple)
        bench.scores.update(act_multiple=multiple, passed=passed)

def record_try(bench, multiple, passed):
    bench.scores["tried"].append({"multiple": multiple, "passed": passed})
    return passed

def pts(bench):
    o = bench.options
    element_s = o.duration_s or o.scaled(PTS_ELEMENT_S)
    sizes = tuple(o.block_sizes or PTS_BLOCK_SIZES)
    if 4 * KIB not in sizes:
        raise BenchError("the PTS IOPS test tracks 4 KiB random writes: --block-sizes must include 4096")
    if max(sizes) > bench.span:
        raise BenchError(f"a block size of {max(sizes)} bytes exceeds the span; give a larger --span")
    bench.scores["purge"] = purge_statement(bench.target)

    def purge_fill(name):
        """PTS's purge (a discard of the span, see purge_statement) and its
        workload-independent preconditioning, twice the span in 128 KiB sequential writes."""
        fill = g.sequential_fill(span=bench.span, passes=2, seed=o.seed)
        purge = discard_generator(0, bench.span, o.seed)
        bench.run_one(name, "precondition", g.Sequence("snia-purge-fill", [*purge.stages, fill],
                                                      seed=o.seed))

    purge_fill("purge-fill")
    bench.scores["iops_matrix"] = []
    bench.scores["latency"] = []

    def iops_element(r, share, size):
        gen = g.random_mix(block_size=size, read_share=share, span=bench.span,
                           unbounded=True, queue_depth=32, seed=o.seed + r)
        name = f"iops-r{r:02d}-rs{percent(share)}-{size_label(size)}"
        return bench.run_one(name, "measure", gen, qd=32, time_limit_s=element_s).summary.iops()

    def latency_element(r, share, size):
        gen = g.random_mix(block_size=size, read_share=share, span=bench.span,
                           unbounded=True, queue_depth=1, seed=o.seed + r)
        name = f"lat-r{r:02d}-rs{percent(share)}-{size_label(size)}"
        summary = bench.run_one(name, "measure", gen, qd=1, time_limit_s=element_s).summary
        clat = summary.to_dict()["tracereplay"]["all"]["clat_ns"]
        return {"mean_ns": clat["mean"], "max_ns": clat["max"],
                "p99_ns": clat.get("percentile", {}).get("99.000000"), "iops": summary.iops()}

    elements = [(s, b) for s in PTS_READ_SHARES for b in sizes]
    bench.scores["iops_steady_state"] = {}
    rounds = pts_rounds(elements, (0.0, 4 * KIB), iops_element, lambda v: v, o.max_rounds,
                     bench.scores["iops_steady_state"])
    for (share, size), values in rounds.items():
        bench.scores["iops_matrix"].append({"read_share": share, "block_size": size,
                                           "iops": sum(values) / len(values)})
    bench.scores["latency_steady_state"] = {}
    # The latency test is a test of its own in PTS: purged and preconditioned afresh, not
    # run on the drive as the IOPS test's rounds left it.
    purge_fill("lat-purge-fill")
    elements = [(s, b) for s in PTS_LATENCY_READ_SHARES for b in PTS_LATENCY_BLOCK_SIZES]
    rounds = pts_rounds(elements, (0.0, 4 * KIB), latency_element, lambda v: v["mean_ns"],
                     o.max_rounds, bench.scores["latency_steady_state"])
    for (share, size), values in rounds.items():
        bench.scores["latency"].append({
            "read_share": share, "block_size": size,
            "mean_ns": sum(v["mean_ns"] for v in values) / len(values),
            "max_ns": max(v["max_ns"] for v in values),
            "p99_ns": max((v["p99_ns"] or 0) for v in values),
        })


def discard_generator(start: int, end: int, seed: int = 0):
    """Discards of [start, end) in pieces of PURGE_PIECE, one after the other: PTS's purge and
    --op's whole-target discard (BLKDISCARD on a block device, a punched hole in a file)."""
    return g.Sequence("discard", [g.Purge(span=min(PURGE_PIECE, end - at), span_start=at, seed=seed)
                                  for at in range(start, end, PURGE_PIECE)], seed=seed)


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


# The procedure of each test in replay.bench.TESTS.
PROCEDURES = {"mix": mix, "seqmix": seqmix, "steady": steady, "act": act, "pts": pts}
