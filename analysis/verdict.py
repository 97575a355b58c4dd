"""The verdict: does a drive's synthetic advantage show up when real traces are replayed on it?

Two targets, A and B. Synthetic ratios come from results sets (`replay bench`) or plain
closed-loop results files; real-use ratios from `replay run` results of the same traces on
both, matched by trace name. Every ratio is "B over A, > 1 means B is better".
"""
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from analysis import score_labels
from analysis.compare import target_label
from analysis.histogram import LatencyHistogram
from analysis.results import SET_FILE, SUITE_TEST, Results, ResultsError, ResultsSet, load

# (scores key of a results set's test, the verdict's short name, unit); all are
# higher-is-better. The unit is the one table's (analysis.score_labels); the names are short,
# as the verdict's sentences say them.
SYNTHETIC_SCORES = {test: (key, name, score_labels.label(key)[1]) for test, key, name in (
    # Seed 000's 70/30 "QD32": 32 workers at QD1 (the 1x32 split is iops_70_30_1x32).
    ("mix", "iops_70_30_32x1", "70/30 QD32 (32 workers x QD1)"),
    ("steady", "steady_iops", "steady state"),
    ("act", "act_multiple", "ACT"),
)}
# A real ratio within this of 1.0 is "no difference": without repeat runs we cannot say
# more, and 5 % is about the run-to-run spread of a loop device on these shared machines.
NOISE = 0.05
# Shares of the synthetic advantage (on a log scale) that decide the one-word answer.
SHOWS_UP, PARTLY = 0.5, 0.1
# The suite's question (issue 24): in how many workloads does the faster target change the
# run time by more than this share of the slower one's? Without a synthetic test, it is also
# the line between "yes" and "no" in a workload.
RUN_TIME_CHANGE = 0.10


class VerdictError(ResultsError):
    """The inputs cannot be set side by side: missing, mismatched, empty."""


@dataclass
class Synthetic:
    key: str  # "mix", "steady", "act" or "run:NAME" for a plain results file
    label: str
    unit: str
    a: float
    b: float
    partial: bool = False

    @property
    def ratio(self) -> float:
        return self.b / self.a if self.a > 0 else math.inf


@dataclass
class RealUse:
    """What one replay of a trace cost the workload, over its first `rows` I/Os."""

    rows: int
    wait_ns: int  # sum over I/Os of complete - intended: time the workload waited on storage
    p99_ns: int  # p99 of complete - intended
    finish_ns: int | None  # closed loop only: first intended to last completion
    partial: bool


@dataclass
class Workload:
    name: str
    closed_loop: bool
    a: RealUse
    b: RealUse
    wait_ratio: float  # A / B: > 1 means B waits less
    p99_ratio: float
    finish_ratio: float | None
    primary: str  # "finish" (closed loop) or "wait"
    share: float | None  # of the reference synthetic advantage, on a log scale
    answer: str  # "yes", "partly", "no", "reversed", "n/a"
    sentence: str
    mode: str = ""  # the replays' timing: "afap", "causal" or "original"

    @property
    def primary_ratio(self) -> float:
        return self.finish_ratio if self.primary == "finish" else self.wait_ratio


@dataclass
class Verdict:
    label_a: str
    label_b: str
    synthetic: list[Synthetic]
    workloads: list[Workload]
    notes: list[str] = field(default_factory=list)
    # The faster target's label: B or A on the reference synthetic test, or, without one, on
    # the geometric mean of the workloads' ratios.
    faster: str = ""

    @property
    def reference(self) -> Synthetic | None:
        return self.synthetic[0] if self.synthetic else None

    def run_time_changes(self) -> tuple[list[tuple[str, float]], int]:
        """([(workload, the faster target's run time over the slower one's)] for the workloads
        whose run time it changes by more than RUN_TIME_CHANGE, the number of workloads
        replayed to finish on both)."""
        compared = [w for w in self.workloads if w.finish_ratio]
        b_faster = self.faster == self.label_b
        factors = [(w.name, 1 / w.finish_ratio if b_faster else w.finish_ratio) for w in compared]
        return [(n, f) for n, f in factors if abs(f - 1) > RUN_TIME_CHANGE], len(compared)

    def run_time_sentence(self) -> str | None:
        """In how many workloads the faster target changes the run time by more than 10 %."""
        changed, compared = self.run_time_changes()
        if not compared:
            return None
        which = "".join(f"{', ' if i else ': '}{n} {1 / f:.2f}x sooner" if f < 1 else
                        f"{', ' if i else ': '}{n} {f:.2f}x later" for i, (n, f) in enumerate(changed))
        return (f"{self.faster} changes the run time by more than {RUN_TIME_CHANGE:.0%} in "
                f"{len(changed)} of the {compared} workloads replayed to finish{which}.")

    def to_dict(self) -> dict:
        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x

        out = {
            "a": self.label_a, "b": self.label_b,
            "synthetic": [{**asdict(s), "ratio": s.ratio} for s in self.synthetic],
            "workloads": [{**asdict(w), "primary_ratio": w.primary_ratio} for w in self.workloads],
            "faster": self.faster,
            "run_time_change": {"threshold": RUN_TIME_CHANGE, "compared": self.run_time_changes()[1],
                                "changed": dict(self.run_time_changes()[0])},
            "notes": self.notes,
        }
        return clean(out)

    def format_table(self) -> str:
        a, b = self.label_a, self.label_b
        lines = [f"A = {a}", f"B = {b}", ""]
        if self.synthetic:
            lines.append("synthetic (B / A, higher is better for B):")
        else:
            lines.append(f"no synthetic test given: {self.faster} is the faster over the workloads")
        for s in self.synthetic:
            mark = "  (partial)" if s.partial else ""
            lines.append(f"  {s.label:<22}{_num(s.a):>12} {s.unit:<7}{_num(s.b):>12} {s.unit:<7}"
                         f"{_ratio(s.ratio):>8}{mark}")
        lines += ["", "real use (A / B: > 1x means B is better):",
                  f"  {'workload':<14}{'mode':<8}{'waited A':>10}{'waited B':>10}{'ratio':>8}"
                  f"{'p99 A':>10}{'p99 B':>10}{'ratio':>8}{'finish':>8}{'share':>7}  answer"]
        for w in self.workloads:
            name = w.name + (" *" if w.a.partial or w.b.partial else "")
            share = "-" if w.share is None else f"{w.share * 100:.0f}%"
            lines.append(
                f"  {name:<14}{mode_label(w):<8}{_secs(w.a.wait_ns):>10}"
                f"{_secs(w.b.wait_ns):>10}{_ratio(w.wait_ratio):>8}{_secs(w.a.p99_ns):>10}"
                f"{_secs(w.b.p99_ns):>10}{_ratio(w.p99_ratio):>8}"
                f"{_ratio(w.finish_ratio) if w.finish_ratio else '-':>8}{share:>7}  {w.answer}")
        lines.append("")
        lines += [w.sentence for w in self.workloads]
        if self.run_time_sentence():
            lines += ["", self.run_time_sentence()]
        if any(w.a.partial or w.b.partial for w in self.workloads):
            lines.append("* partial: an interrupted run; compared over the I/Os both runs did")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def mode_label(w) -> str:
    """A workload's timing in one word, as the verdict's tables give it."""
    return "causal" if w.mode == "causal" else "afap" if w.closed_loop else "timed"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return "inf" if not math.isfinite(r) else f"{r:.2f}x"


def _secs(ns: int) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f}ms"
    return f"{ns / 1e3:.0f}us"


# ---- synthetic side -------------------------------------------------------------------------

def _synthetic_of(item) -> dict[str, tuple]:
    """{key: (label, unit, value, partial)} of one results set or closed-loop results file."""
    if isinstance(item, ResultsSet):
        known = SYNTHETIC_SCORES.get(item.test)
        if known is None:
            return {}
        key, label, unit = known
        value = item.scores.get(key)
        if not isinstance(value, (int, float)) or value is None:
            raise VerdictError(f"{item.path}: the {item.test} results set has no {key!r} score; "
                               "was the bench run cut short? Run it again")
        return {item.test: (label, unit, float(value), item.interrupted)}
    if not item.closed_loop:
        raise VerdictError(f"{item.path}: a timed replay is no synthetic score; give a results set "
                           "of `replay bench` or a closed-loop (--afap) run")
    qd = item.run.get("qd")
    return {f"run:{item.name}": (f"{item.name} QD{qd}", "IOPS", float(item.summary.iops()),
                                 item.interrupted)}


def _collect_synthetic(paths) -> dict[str, tuple]:
    out = {}
    for path in paths:
        for key, value in _synthetic_of(load(path)).items():
            if key in out:
                raise VerdictError(f"{path}: a second {value[0]} score for the same target; "
                                   "give one results set per test and target")
            out[key] = value
    return out


def synthetic_ratios(paths_a, paths_b) -> list[Synthetic]:
    a, b = _collect_synthetic(paths_a), _collect_synthetic(paths_b)
    common = [k for k in list(SYNTHETIC_SCORES) + sorted(a) if k in a and k in b]
    common = list(dict.fromkeys(common))
    if not common:
        raise VerdictError(
            f"no synthetic test was run on both targets (A has {', '.join(sorted(a)) or 'none'}, "
            f"B has {', '.join(sorted(b)) or 'none'}); run the same `replay bench` test on both")
    out = []
    for k in common:
        (label, unit, va, pa), (_, _, vb, pb) = a[k], b[k]
        if va <= 0 or vb <= 0:
            raise VerdictError(f"the {label} score is {va if va <= 0 else vb} on one target: the "
                               "run did no I/O; run it again")
        out.append(Synthetic(k, label, unit, va, vb, pa or pb))
    return out


# ---- real-use side --------------------------------------------------------------------------

def _suite_set(path: Path) -> ResultsSet | None:
    """The results set of `replay suite` in directory `path`, or None for another set (a
    bench's, whose test is no workload)."""
    try:
        doc = json.loads((path / SET_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return load(path) if isinstance(doc, dict) and doc.get("test") == SUITE_TEST else None


def _results_files(paths) -> dict[str, Results]:
    """Results files of timed or closed-loop trace replays, by trace name: files, or the
    *.parquet in directories (results sets are skipped: they are synthetic)."""
    out = {}
    for path in map(Path, paths):
        if not path.exists():
            raise VerdictError(f"{path}: no such file or directory; give results files of "
                               "`replay run` or a directory holding them")
        if path.is_dir() and (path / SET_FILE).exists():
            suite = _suite_set(path)
            if suite is None:
                raise VerdictError(f"{path}: a results set of `replay bench`; give it with "
                                   "--synthetic, and the results of `replay run` or `replay suite` "
                                   "with --traces")
            runs = suite.measured()
        else:
            files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
            if not files:
                raise VerdictError(f"{path}: holds no .parquet results files; replay the traces "
                                   "with `replay run TRACE TARGET -o DIR/NAME.parquet` first")
            runs = [load(file) for file in files]
        for r in runs:
            if r.name in out:
                raise VerdictError(f"{r.path} and {out[r.name].path} are both results of trace "
                                   f"{r.name!r} on one target; keep one of them")
            out[r.name] = r
    return out


def real_use(results: Results, rows: int | None = None) -> RealUse:
    """Stream one results file: waiting time, p99 workload latency and time to finish, over
    its first `rows` rows (all by default)."""
    hist = LatencyHistogram()
    wait = 0
    done = 0
    first, last = None, None
    for chunk in results.chunks(["intended_ns", "issue_ns", "complete_ns"]):
        if rows is not None:
            chunk = {k: v[: max(rows - done, 0)] for k, v in chunk.items()}
        n = len(chunk["issue_ns"])
        if n == 0:
            break
        done += n
        issued = chunk["issue_ns"] >= 0
        intended = np.minimum(chunk["intended_ns"][issued], chunk["issue_ns"][issued])
        complete = chunk["complete_ns"][issued]
        if not len(complete):
            continue
        waited = complete - intended
        wait += int(waited.sum())
        hist.add(waited)
        lo, hi = int(intended.min()), int(complete.max())
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    if hist.count == 0:
        raise VerdictError(f"{results.path}: no I/O of it was issued; run the replay again")
    partial = results.interrupted or (rows is not None and rows < results.rows)
    finish = last - first if results.runs_to_finish and not partial else None
    return RealUse(done, wait, int(hist.percentile(99.0)), finish, partial)


def _log_share(real: float, synthetic: float) -> float | None:
    """How much of the synthetic advantage the real one is, on a log scale: 1.0 all of it,
    0 none (a real ratio of 1x), negative when real use goes the other way. A plain ratio of
    ratios (real / synthetic) would call "no difference at all" 1/synthetic of the advantage."""
    if not (math.isfinite(real) and math.isfinite(synthetic)) or real <= 0 or abs(math.log(synthetic)) < 0.01:
        return None
    return math.log(real) / math.log(synthetic)


def _answer(real: float, share: float | None) -> str:
    if share is None:
        return "n/a"
    if abs(real - 1) <= NOISE:
        return "no"
    if share < 0:
        return "reversed"
    return "yes" if share >= SHOWS_UP else "partly" if share >= PARTLY else "no"


def _sentence(w: Workload, ref: Synthetic, a: str, b: str) -> str:
    fast, slow, synth = (b, a, ref.ratio) if ref.ratio >= 1 else (a, b, 1 / ref.ratio)
    # Ratios as "how much better the faster drive of the synthetic test does".
    real, wait = (w.primary_ratio, w.wait_ratio) if ref.ratio >= 1 else (1 / w.primary_ratio, 1 / w.wait_ratio)
    head = f"{fast} is {synth:.2f}x faster than {slow} on {ref.label};"
    if w.answer == "n/a":
        return f"{head} on {w.name} the comparison is undefined (no synthetic difference)."
    if w.mode == "causal" and w.primary == "finish":
        return f"{head} {_causal_clause(w, real, wait, fast)}"
    what = "finishes" if w.primary == "finish" else "waits on storage"
    if abs(real - 1) <= NOISE:
        return f"{head} on {w.name} it {what} within {NOISE:.0%} of the same time: the advantage does not show."
    if real > 1:
        verb = f"{real:.2f}x sooner" if w.primary == "finish" else f"{real:.2f}x less"
        return f"{head} on {w.name} it {what} {verb}: {w.share:.0%} of the synthetic advantage."
    verb = f"{1 / real:.2f}x later" if w.primary == "finish" else f"{1 / real:.2f}x more"
    return f"{head} on {w.name} it {what} {verb} on {fast}: the advantage is reversed."


def _causal_clause(w: Workload, real: float, wait: float, fast: str) -> str:
    """A causal replay's time to finish is the application's run time, predicted: say it in
    those terms, and which replay said it."""
    if abs(real - 1) <= NOISE:
        # Paced by its own users, not the drive: its run time holds, its I/Os may still gain.
        gain = f", though its I/Os wait {wait:.2f}x less on {fast}" if wait > 1 + NOISE else ""
        return (f"{w.name} would finish within {NOISE:.0%} of the same time on either (causal replay){gain}: "
                "the advantage does not show in its run time.")
    if real > 1:
        return f"{w.name} would finish {real:.2f}x sooner on {fast} (causal replay): {w.share:.0%} of the synthetic advantage."
    return f"{w.name} would finish {1 / real:.2f}x later on {fast} (causal replay): the advantage is reversed."


def _sentence_alone(w: Workload, b_faster: bool, labels) -> str:
    """Without a synthetic test: what the faster target does to the workload, by itself."""
    fast = labels[1] if b_faster else labels[0]
    real = w.primary_ratio if b_faster else 1 / w.primary_ratio
    if w.primary == "wait":
        if w.answer == "no":
            return f"On {w.name} the I/Os wait within {RUN_TIME_CHANGE:.0%} of the same time on either."
        return (f"On {w.name} the I/Os wait {real:.2f}x less on {fast}." if real > 1 else
                f"On {w.name} the I/Os wait {1 / real:.2f}x more on {fast}.")
    verb, how = ("would finish", " (causal replay)") if w.mode == "causal" else ("finishes", "")
    if w.answer == "no":
        return f"{w.name} {verb} within {RUN_TIME_CHANGE:.0%} of the same time on either{how}."
    return (f"{w.name} {verb} {real:.2f}x sooner on {fast}{how}." if real > 1 else
            f"{w.name} {verb} {1 / real:.2f}x later on {fast}{how}.")


def judge(w: Workload, ref: Synthetic | None, labels, b_faster: bool) -> Workload:
    """Fill in the workload's share, answer and sentence: against the reference synthetic
    test, or without one, by whether the faster target changes its run time (or its waits)
    by more than RUN_TIME_CHANGE."""
    if ref is not None:
        w.share = _log_share(w.primary_ratio, ref.ratio)
        w.answer = _answer(w.primary_ratio, w.share)
        w.sentence = _sentence(w, ref, *labels)
        return w
    real = w.primary_ratio if b_faster else 1 / w.primary_ratio
    w.answer = "no" if abs(1 / real - 1) <= RUN_TIME_CHANGE else "yes" if real > 1 else "reversed"
    w.sentence = _sentence_alone(w, b_faster, labels)
    return w


def compare_workload(ra: Results, rb: Results, ref: Synthetic | None, labels,
                     b_faster: bool | None = None) -> Workload:
    """One workload on both targets, judged (`judge`); `b_faster` says which target is the
    faster where there is no synthetic reference to say it."""
    w = measure_workload(ra, rb)
    return judge(w, ref, labels, ref.ratio >= 1 if ref is not None else bool(b_faster))


def measure_workload(ra: Results, rb: Results) -> Workload:
    """One workload's figures on both targets; `judge` fills in what they mean."""
    if ra.run.get("mode") == "causal" or rb.run.get("mode") == "causal":
        if ra.run.get("mode") != rb.run.get("mode"):
            raise VerdictError(f"{ra.path} and {rb.path}: trace {ra.name!r} was replayed with causal "
                               "timing on one target only; replay both with --timing causal")
    if ra.closed_loop != rb.closed_loop:
        raise VerdictError(f"{ra.path} and {rb.path}: trace {ra.name!r} was replayed "
                           f"{'closed-loop' if ra.closed_loop else 'with its timing'} on A and "
                           f"{'closed-loop' if rb.closed_loop else 'with its timing'} on B; "
                           "replay both the same way")
    ta, tb = ra.trace.get("rows"), rb.trace.get("rows")
    if ta is not None and tb is not None and ta != tb:
        raise VerdictError(f"{ra.path} and {rb.path}: both are named {ra.name!r} but replayed "
                           f"different traces ({ta} and {tb} I/Os); compare results of the same trace")
    if ra.speed != rb.speed and not ra.closed_loop:
        raise VerdictError(f"{ra.path} and {rb.path}: trace {ra.name!r} was replayed at speed "
                           f"{ra.speed} on A and {rb.speed} on B; replay both at one speed")
    rows = None
    if ra.interrupted or rb.interrupted:
        rows = min(ra.rows, rb.rows)
    ua, ub = real_use(ra, rows), real_use(rb, rows)
    wait_ratio = ua.wait_ns / ub.wait_ns if ub.wait_ns > 0 else math.inf
    p99_ratio = ua.p99_ns / ub.p99_ns if ub.p99_ns > 0 else math.inf
    finish_ratio = ua.finish_ns / ub.finish_ns if ua.finish_ns and ub.finish_ns else None
    primary = "finish" if finish_ratio is not None else "wait"
    return Workload(ra.name, ra.closed_loop, ua, ub, wait_ratio, p99_ratio, finish_ratio, primary,
                    None, "", "", ra.run.get("mode") or "original")


def _label(items, fallback: str) -> str:
    for item in items:
        if item.target.get("path"):
            return target_label(item.target)
    return fallback


def verdict(synthetic_a, synthetic_b, traces_a, traces_b, label_a=None, label_b=None) -> Verdict:
    """Compare two targets: `synthetic_*` are results sets (or closed-loop results files) of
    each, or none for neither; `traces_*` results files, directories of them or `replay suite`
    sets of real traces replayed on each."""
    for what, paths in (("--synthetic", synthetic_a if synthetic_b else synthetic_b),
                        ("--synthetic", synthetic_b if synthetic_a else synthetic_a),
                        ("--traces", traces_a), ("--traces", traces_b)):
        if not paths and (what == "--traces" or synthetic_a or synthetic_b):
            raise VerdictError(f"{what} needs results for both targets A and B")
    synth = synthetic_ratios(synthetic_a, synthetic_b) if synthetic_a else []
    ra, rb = _results_files(traces_a), _results_files(traces_b)
    common = [name for name in ra if name in rb]
    if not common:
        raise VerdictError(
            f"no trace was replayed on both targets (A: {', '.join(sorted(ra))}; B: "
            f"{', '.join(sorted(rb))}); results are matched by the trace's name")
    labels = (label_a or _label([*ra.values()], "A"), label_b or _label([*rb.values()], "B"))
    if labels[0] == labels[1]:
        labels = (f"A: {labels[0]}", f"B: {labels[1]}")
    notes = [f"{name} was replayed only on {side}; left out"
             for side, mine, other in (("A", ra, rb), ("B", rb, ra)) for name in mine if name not in other]
    notes += [f"the {s.label} score comes from an interrupted run (partial)" for s in synth if s.partial]
    workloads = [measure_workload(ra[n], rb[n]) for n in common]
    if synth:
        b_faster = synth[0].ratio >= 1
    else:  # the geometric mean of the ratios A / B (> 1: B is faster) of every workload
        logs = [math.log(w.primary_ratio) for w in workloads if 0 < w.primary_ratio < math.inf]
        b_faster = sum(logs) >= 0
    for w in workloads:
        judge(w, synth[0] if synth else None, labels, b_faster)
    return Verdict(labels[0], labels[1], synth, workloads, notes, labels[1] if b_faster else labels[0])
