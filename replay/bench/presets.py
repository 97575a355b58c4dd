"""The seed presets: each review's test as the review ran it (`replay bench seed000-mix`, ...),
and `replay bench --list`'s description of each.
"""
from dataclasses import dataclass

from analysis import scoring
from replay.bench.options import (ACT_PERIOD_S, ACT_QUEUES, ACT_SEARCH_START, ACT_THREADS,
                                  ACT_THREADS_PER_QUEUE, GIB, MIX_POINT_S, MIX_SPAN, QD_SCALING,
                                  READ_SHARES, ROUND_S, SIX_SHARES, STEADY_70_30_PRECONDITION_S,
                                  STEADY_70_30_S, STEADY_70_30_WINDOW_S, STEADY_S, BenchError,
                                  BenchOptions, percent, split_label)
from traces.units import human_bytes


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
           "1/8/64 ms limits, then narrowed; latency from the due time (the queue-era ACT), "
           "at most 64 transactions outstanding (ACT's default queues and threads)",
           {"search": True, "start": ACT_SEARCH_START, "step": 10, "duration_s": ACT_PERIOD_S,
            "period_s": ACT_PERIOD_S, "act_threads": ACT_THREADS},
           "how large-block I/O and the queues share the threads: ACT runs its large-block reads "
           "and writes on one thread each, and deals reads round-robin to 8 queues of 8 threads; "
           "here all share one pool of 64 in-flight slots, taken in the order due"),
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
           "the QD steps, the length of the QD-scaling and sweep points, the steady-state "
           "rounds, how consistency is scored and the latency distribution's ranges: QD 1, 2, "
           "4, 8, 16, 32, 3 min a point, 1-minute rounds, seed 003's average / standard "
           "deviation of the per-second IOPS in the scored window, and device latency in 1-2-5 "
           "steps from 50 us to over 10 ms over that window"),
    Preset("seed003-steady", "steady", SEED_003, "AnandTech, Maxiotek MK8115 (2017): performance consistency",
           "whole-target fill, then an hour of 4 KiB random writes at QD32 scored on the last "
           "400 s (average IOPS, average / stddev); then the same at 25 % over-provisioning "
           "(\"25% Over-Provisioning\")",
           {"read_share": 0.0, "duration_s": STEADY_S, "window_s": float(scoring.CONSISTENCY_WINDOW_S),
            "round_s": ROUND_S, "span": "target", "op": (0, 25)},
           "the steady-state rounds and how the drive was over-provisioned: 1 minute; the whole "
           "target discarded (as a secure erase would leave it), then fill and test confined to "
           "its first 75 %"),
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


# A steady-state run's rounds and scored window, which keep their share of it when --duration
# alone changes its length.
_FOLLOW_DURATION = ("round_s", "window_s")


def duration_follows(name: str, overrides: dict) -> dict:
    """`overrides` plus, when they change a steady preset's duration but not its rounds or its
    scored window, those scaled by the same factor (whole seconds, at least 1): a shorter run
    is the same test, shorter, as --scale makes it, not 60 s rounds that no longer fit (seed
    002's at --duration 30 found zero rounds and reported "too few rounds")."""
    preset = PRESETS.get(name)
    if preset is None or preset.test != "steady" or not overrides.get("duration_s"):
        return dict(overrides)
    factor = overrides["duration_s"] / preset.options["duration_s"]
    return {**{k: float(max(1, round(preset.options[k] * factor))) for k in _FOLLOW_DURATION
               if preset.options.get(k)}, **overrides}


def preset_options(name: str, scale: float = 1.0, overrides: dict | None = None):
    """(test, BenchOptions) of preset `name` at `scale`; `overrides` (BenchOptions fields the
    user gave) replace the preset's, and are recorded as not the review's. A steady preset's
    rounds and window follow an overridden duration (duration_follows)."""
    preset = PRESETS.get(name)
    if preset is None:
        raise BenchError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} "
                         "(replay bench --list shows them)")
    overrides = duration_follows(name, overrides or {})
    o = BenchOptions(scale=scale)
    fields = {}
    for key, value in preset.options.items():
        if key.endswith("_s") and value is not None:
            value = o.scaled(value, whole=key in _WHOLE_SECONDS)
        fields[key] = value
    fields.update(overrides)
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
            + "/".join(str(percent(x)) for x in shares) + f" %, data {data}"
            for split, shares, data in o.sweeps)]
    if test == "seqmix":
        params += ["128 KiB sequential, 1x1, reads " + "/".join(str(percent(x)) for x in o.read_shares) + " %"]
    if test == "steady":
        params += [f"4 KiB random, {percent(o.read_share)} % reads, 1x32",
                   f"precondition {o.precondition_s or 0:g} s" if o.precondition_s else "precondition: one fill",
                   f"scored window: last {o.window_s:g} s, rounds of {o.round_s:g} s"]
        if o.qd_scaling:
            params.append("then QD scaling " + ", ".join(f"QD{q}" for q in o.qd_scaling)
                          + f", {o.point_s:g} s each")
        if o.read_shares:
            params.append("then reads " + "/".join(str(percent(x)) for x in o.read_shares)
                          + f" % at 1x32, {o.point_s:g} s each")
    if test == "act":
        params += [f"search from {o.start}x (or --multiple) by {o.step}x", f"period {o.period_s:g} s",
                   "act_prep first", "latency from the due time (queue-era ACT)",
                   f"at most {o.act_threads} I/Os outstanding, later ones waiting their turn "
                   f"(ACT's {ACT_QUEUES} queues x {ACT_THREADS_PER_QUEUE} threads per queue, the "
                   "defaults of its config helper that seed 000 ran: \"a total of 64 threads\")"]
    if o.duration_s:
        params.append(f"duration {o.duration_s:g} s" + (" a point" if test in ("mix", "seqmix") else ""))
    if o.op != (0,):
        params.append("passes: " + ", ".join(
            f"{p} % over-provisioning (the whole target discarded, then confined to its first "
            f"{100 - p} %)" if p else "the default capacity" for p in o.op))
    lines.append("  " + "; ".join(params))
    if preset.unstated:
        lines.append(f"  not stated in the seed: {preset.unstated}")
    return lines
