"""`replay bench TEST [TARGET] -o DIR`: the reviewers' standard tests on the engine, scored."""
import json
import re
import signal
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay import signals
from replay.commands import (PowerColumns, PowerLog, PowerStart, PowerTimeUnit, fail,
                             power_layout)
from replay.bench import TESTS
from replay.commands.run import Engine
from traces.errors import ReplayError

# The seed presets (replay.bench.presets.PRESETS), named here so that --help needs no import of the
# generators; a test checks the two agree.
PRESET_HELP = (
    "seed000-mix (seed 000's 70/30 sweep at 32 workers x QD1), seed000-act (seed 000's ACT "
    "search), seed001-mix (seed 001's QD3 sweep over 16 GiB of a filled drive), "
    "seed001-seqmix (seed 001's 128 KiB sequential sweep), seed002-steady (seed 002's 2 h + "
    "6 h 70/30 steady state, QD scaling and sweep), seed003-steady (seed 003's hour of random "
    "writes, then again at 25 % over-provisioning), seed004-iometer (seed 004's 4 KiB random "
    "QD3/QD32, random and pseudo-random data)")
# BenchOptions fields per CLI parameter, for telling a preset which options were given.
_FIELDS = {"duration": "duration_s", "span": "span", "window": "window_s", "round_": "round_s",
           "max_rounds": "max_rounds", "multiple": "multiple", "search": "search",
           "start": "start", "step": "step", "period": "period_s", "block_sizes": "block_sizes",
           "no_fill": "fill", "fill": "fill_bytes", "qd": "qd_splits", "read_shares": "read_shares",
           "data": "data", "read_share": "read_share", "precondition": "precondition_s",
           "point": "point_s", "qd_scaling": "qd_scaling", "seed": "seed", "engine": "engine",
           "destroy_data": "destroy_data", "no_prep": "act_prep", "act_latency": "act_latency",
           "act_threads": "act_threads",
           "op": "op", "power_log": "power_log", "power_columns": "power_columns",
           "power_time_unit": "power_time_unit", "power_start": "power_start"}
# Options that say how to run or measure, not what: given with a preset, not its overrides.
_NOT_OVERRIDES = ("engine", "destroy_data", "seed", "power_log", "power_columns",
                  "power_time_unit", "power_start")


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'8G', '64M', '4096', '4k' (powers of 1024) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ReplayError(f"{text!r} is not a size: give bytes or a number with K, M, G or T "
                          "(powers of 1024), for example 8G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    # Whole percents only: runs are named and scored by them (50.5 ran and was scored as 50).
    if not (0 <= value <= 100 and value == int(value)):
        raise ReplayError(f"{text!r} is not a read share: give a whole percent from 0 to 100, "
                          "for example 70")
    return int(value) / 100


def _whole(text: str, option: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ReplayError(f"{option} takes whole numbers of at least 1, comma separated, not {text!r}")
    return int(text)


def bench(
    ctx: typer.Context,
    test: Annotated[Optional[str], typer.Argument(
        help="Which test: mix (4 KiB random read shares at 1x3, 1x32 and 32x1, workers x QD), "
             "seqmix (128 KiB sequential at QD1), steady (4 KiB random at QD32 until steady "
             "state), act (Aerospike ACT load) or pts (SNIA PTS IOPS and latency); or a preset "
             "reproducing one review's test exactly: " + PRESET_HELP + ". --list shows each "
             "preset's parameters; options given with a preset replace its values and are "
             "recorded as overrides.",
        show_default=False)] = None,
    target: Annotated[Optional[str], typer.Argument(
        help="Block device or regular file to test; its data WILL be destroyed (the fill writes "
             "the whole target). May be left out only with --engine null.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o",
        help="Directory for the results set: results.json and one Parquet results file per run. "
             "Created if missing; files of the same names are replaced.",
        show_default=False)] = None,
    list_: Annotated[bool, typer.Option(
        "--list",
        help="Print each seed preset with its review and parameters, and exit.")] = False,
    scale: Annotated[float, typer.Option(
        help="Multiply every run length by this: 0.01 runs the hour-long steady test in 36 s. "
             "Scored windows and rounds scale too (whole seconds, at least 1).")] = 1.0,
    duration: Annotated[Optional[float], typer.Option(
        help="Seconds per measurement, overriding --scale: per point (mix, seqmix), the whole run "
             "(steady, act) or per element and round (pts). Steady's scored window and rounds "
             "keep their share of the run unless --window or --round is given.")] = None,
    span: Annotated[Optional[str], typer.Option(
        help="Bytes of the target the test uses, from offset 0, for example 16G (default: 8G for "
             "mix, the whole target otherwise). The target must hold it.")] = None,
    engine: Annotated[Optional[Engine], typer.Option(
        help="I/O engine, as for replay run; null does no I/O (for testing the pipeline).",
        show_default=False)] = None,
    destroy_data: Annotated[bool, typer.Option(
        "--destroy-data",
        help="Test a block device even though it looks in use (mounted, partitioned, holding a "
             "filesystem). Its data WILL be destroyed.")] = False,
    seed: Annotated[int, typer.Option(
        help="Seed of the generators; the same seed gives the same I/Os.")] = 0,
    window: Annotated[Optional[float], typer.Option(
        help="steady: seconds at the end that are scored (default 400, scaled).")] = None,
    round_: Annotated[Optional[float], typer.Option(
        "--round",
        help="steady: seconds per steady-state round (default 60, scaled).")] = None,
    max_rounds: Annotated[int, typer.Option(
        help="pts: rounds of the SNIA steady-state check before giving up (steady checks every "
             "round of its run).")] = 25,
    multiple: Annotated[Optional[float], typer.Option(
        help="act: the load multiple X (2,000 X reads and 1,000 X writes per second; default 1). "
             "With --search, and in seed000-act, where the search starts instead of --start.",
        show_default=False)] = None,
    search: Annotated[bool, typer.Option(
        "--search",
        help="act: start at --start and step down by --step to the highest passing multiple, then "
             "narrow it to 1x; that is the score.")] = False,
    start: Annotated[int, typer.Option(help="act --search: the first, high multiple.")] = 150,
    step: Annotated[int, typer.Option(
        help="act --search: how far each failing run steps down.")] = 10,
    period: Annotated[Optional[float], typer.Option(
        help="act: seconds per scored period (default an hour, scaled); every whole period must "
             "meet the limits.")] = None,
    no_prep: Annotated[bool, typer.Option(
        "--no-prep",
        help="act: skip act_prep (zeros over the whole target, then random data) before the first "
             "run.")] = False,
    act_threads: Annotated[int, typer.Option(
        "--act-threads",
        help="act: the most I/Os outstanding at once, ACT's transaction threads; a transaction "
             "due while all are busy waits for one, and the wait is in its latency. Default 64: "
             "the 8 queues x 8 threads per queue of ACT's config helper, as seed 000 ran it.")] = 64,
    act_latency: Annotated[str, typer.Option(
        "--act-latency",
        help="act: which ACT's latency is scored: intended (the queue-era ACT of seed 000: from "
             "the time a transaction was due, its queue wait included) or issue (ACT 6: device "
             "latency).")] = "intended",
    block_sizes: Annotated[Optional[str], typer.Option(
        help="pts: the IOPS test's block sizes, comma separated, including 4096 (default "
             "512,4K,8K,16K,32K,64K,128K,1M).")] = None,
    no_fill: Annotated[bool, typer.Option(
        "--no-fill",
        help="mix, seqmix, steady: skip the 128 KiB sequential fill (the drive is already in the "
             "state wanted).")] = False,
    fill: Annotated[Optional[str], typer.Option(
        "--fill",
        help="mix, seqmix, steady: bytes the 128 KiB sequential fill writes from offset 0, for "
             "example 32G (default: the whole target, as the reviews fill the drive, not just the "
             "span tested).")] = None,
    qd: Annotated[Optional[str], typer.Option(
        "--qd",
        help="mix: the queue-depth splits to run, comma separated, each QD (one worker) or "
             "WORKERSxQD, for example 3 or 1x32,32x1 (default 1x3,1x32,32x1). Each split's whole "
             "sweep runs before the next, after its own fill.")] = None,
    read_shares: Annotated[Optional[str], typer.Option(
        "--read-shares",
        help="mix, seqmix: the sweep's read shares in percent, comma separated, in order (default "
             "100,80,60,40,20,0,70). steady: a sweep at QD32 run after the steady run (seed 002: "
             "100,80,60,40,20,0; default none).")] = None,
    read_share: Annotated[float, typer.Option(
        "--read-share",
        help="steady: reads in percent of the measured 4 KiB random mix (0: random writes, seed "
             "003; 70: seed 002's 70/30).")] = 0.0,
    precondition: Annotated[Optional[float], typer.Option(
        "--precondition",
        help="steady: seconds of 128 KiB sequential writes before the run, wrapping round the "
             "target; at least one whole fill (default: one fill; seed 002: 7200).")] = None,
    point: Annotated[Optional[float], typer.Option(
        "--point",
        help="steady: seconds per point of --qd-scaling and of the --read-shares sweep (default "
             "180, scaled).")] = None,
    qd_scaling: Annotated[Optional[str], typer.Option(
        "--qd-scaling",
        help="steady: queue depths run one after the other after the steady run, at its read "
             "share, comma separated (seed 002: 1,2,4,8,16,32).")] = None,
    data: Annotated[str, typer.Option(
        "--data",
        help="What measured writes carry, as for replay run: random (incompressible), zeros or "
             "compressible:PCT; mix takes several, comma separated, and sweeps each in turn (seed "
             "004: random,compressible:50).")] = "random",
    op: Annotated[Optional[str], typer.Option(
        "--op",
        help="Over-provisioning: a whole percent of the target, 0 to 90, left unused. The whole "
             "target is discarded first (BLKDISCARD on a block device, punched holes in a file), "
             "then the test, its fill included, touches only the first (100 - PERCENT) %, in "
             "whole MiB, for example --op 25 (seed 003's second run). Runs are named opPERCENT-RUN.",
        metavar="PERCENT", show_default=False)] = None,
    power_log: PowerLog = None,
    power_columns: PowerColumns = None,
    power_time_unit: PowerTimeUnit = None,
    power_start: PowerStart = None,
    json_out: Annotated[bool, typer.Option(
        "--json",
        help="Print results.json instead of a table.")] = False,
):
    """Run one of the reviewers' standard tests on TARGET and score it as the reviews do.

    Writes DIR/results.json and one results file per run; Ctrl-C keeps every finished run and the partial one, marked interrupted.

    Example: replay bench mix /dev/sdc -o mix-sdc --scale 0.01
    """
    from replay.bench.options import BenchOptions, check_op, parse_split
    from replay.bench.presets import PRESETS, describe_preset, duration_follows, preset_options
    from replay.bench.scores import format_results
    from replay.bench.session import run_bench

    if list_:
        for preset in PRESETS.values():
            typer.echo("\n".join(describe_preset(preset)))
        return
    if test is None or output is None:
        fail(ReplayError("give a TEST (or a preset, see --list) and --output DIR, for example "
                         "replay bench mix /dev/sdc -o mix-sdc"))
    if test not in TESTS and test not in PRESETS:
        fail(ReplayError(f"unknown test {test!r}: use one of {', '.join(TESTS)} or a preset "
                         f"({', '.join(PRESETS)})"))
    notices = []

    def on_run(entry):
        s = entry["summary"]
        typer.echo(f"{entry['name']}: {s['total_ios']:,} I/Os, {s['iops']:,.0f} IOPS, "
                   f"{s['mb_per_s']:,.1f} MB/s" + (" (interrupted)" if entry["interrupted"] else ""),
                   err=True)

    try:
        options = BenchOptions(
            scale=scale, duration_s=duration, span=parse_size(span) if span else None,
            engine=engine and engine.value, destroy_data=destroy_data, seed=seed, window_s=window,
            round_s=round_, max_rounds=max_rounds, multiple=multiple, search=search,
            start=start, step=step, period_s=period, act_prep=not no_prep,
            act_latency=act_latency, act_threads=act_threads,
            block_sizes=tuple(parse_size(s) for s in block_sizes.split(",")) if block_sizes else None,
            fill=not no_fill, fill_bytes=parse_size(fill) if fill else None,
            qd_splits=tuple(parse_split(x) for x in qd.split(",")) if qd else None,
            read_shares=tuple(_percent(x) for x in read_shares.split(",")) if read_shares else None,
            data=tuple(x.strip() for x in data.split(",")), read_share=read_share / 100,
            precondition_s=precondition, point_s=point,
            qd_scaling=tuple(_whole(x, "--qd-scaling") for x in qd_scaling.split(",")) if qd_scaling else (),
            op=(check_op(op),) if op is not None else (0,),
            power_log=str(power_log) if power_log else None,
            **{f"power_{k}": v for k, v in
               power_layout(power_columns, power_time_unit, power_start).items()})
        preset = None
        if test in PRESETS:
            given = [name for name in _FIELDS
                     if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
            overrides = duration_follows(test, {_FIELDS[name]: getattr(options, _FIELDS[name])
                                                for name in given})
            test, options = preset_options(test, scale, overrides)
            p = PRESETS[ctx.params["test"]]
            preset = {"name": p.name, "seed": p.seed, "review": p.review,
                      "overrides": sorted(k for k in overrides
                                          if k not in _NOT_OVERRIDES)}
        with signals.StopSignals():  # SIGTERM, SIGHUP end the suite as Ctrl-C does
            results = run_bench(test, target, output, options, on_run=on_run, notices=notices,
                                preset=preset)
    except ReplayError as e:
        for n in dict.fromkeys(notices):
            typer.echo(f"note: {n}", err=True)
        fail(e)
    except KeyboardInterrupt as e:  # before the first run
        typer.echo(f"interrupted by {signals.name(signals.signum_of(e))} before the first run: "
                   "nothing was written", err=True)
        raise typer.Exit(signals.exit_status(signals.signum_of(e))) from None
    for n in dict.fromkeys(notices):
        typer.echo(f"note: {n}", err=True)
    if json_out:
        typer.echo(json.dumps(results, indent=2))
    else:
        typer.echo(format_results(results))
        typer.echo(f"results: {output / 'results.json'}")
    if results["interrupted"]:
        typer.echo(f"interrupted: the {len(results['runs'])} runs done are saved in {output}, "
                   "marked interrupted", err=True)
        raise typer.Exit(signals.exit_status(signals.StopSignals.last or signal.SIGINT))
