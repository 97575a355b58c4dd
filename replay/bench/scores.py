"""Scoring a standard test's runs as the reviews do (steady state, consistency, ACT, PTS
rounds), and the console table of a results set.
"""
import math
from dataclasses import asdict

from analysis import act_chart, score_labels, scoring
from analysis.bench_charts import latency_ranges
from analysis.summary import RunSummary
from analysis import power
from replay.bench.options import (SECOND_NS, VERDICT_MIX_KEY, percent, size_label, split_label,
                                  sweep_key)

def _finite(x):
    """JSON has no infinity: an infinite ratio (a perfectly even run) is stored as null."""
    return x if x is None or math.isfinite(x) else None


def pts_rounds(elements, tracked, measure, value, max_rounds, report):
    """PTS rounds: every element once per round until the tracked element's values are
    steady (or `max_rounds`); returns each element's results over the measurement window
    (the steady window, else the last PTS_WINDOW rounds). `report` gets the check."""
    results = {e: [] for e in elements}
    check = None
    for r in range(1, max_rounds + 1):
        for share, size in elements:
            results[(share, size)].append(measure(r, share, size))
        check = scoring.steady_state([value(v) for v in results[tracked]], max_rounds=max_rounds)
        report.update(_steady_report(check))
        if check.steady:
            break
    window = scoring.PTS_WINDOW
    return {e: v[-window:] for e, v in results.items()}


def _steady_report(check) -> dict:
    return {"reached": check.steady, "round": check.steady_round, "status": check.status,
            "rounds": [{**asdict(c), "window": list(c.window) if c.window else None}
                       for c in check.rounds]}


def table_row(name, share, qd, workers, summary: RunSummary, data="random") -> dict:
    t = summary.to_dict()["tracereplay"]
    return {"run": name, "read_share": share, "qd": qd, "workers": workers,
            "split": split_label((workers, qd)), "data": data, "iops": t["iops"],
            "mb_per_s": t["mb_per_s"],
            "p99_ns": t["all"]["clat_ns"].get("percentile", {}).get("99.000000")}


def steady_scores(bins, window_s, round_s, max_rounds, duration_ns) -> dict:
    """The steady test's scores from its per-second bins (scoring.consistency_bins):
    consistency of the last `window_s` seconds and their latency distribution (seed 002), and
    PTS steady state over rounds of `round_s` seconds: over every round of the run when
    `max_rounds` is None (the run's length is set; the check reports the first steady window
    and whether the last five rounds, the state the scored window comes from, are steady).
    `duration_ns` None (an interrupted run) scores up to the last I/O."""
    c = scoring.consistency(bins, window_s=int(window_s), duration_ns=duration_ns)
    series = bins.rate(duration_ns)
    rounds = scoring.round_averages(series, max(1, int(round(round_s))))
    check = scoring.steady_state(rounds, max_rounds=max_rounds or max(1, len(rounds)))
    last = scoring.steady_state(rounds[-scoring.PTS_WINDOW:], max_rounds=scoring.PTS_WINDOW)
    return {
        "steady_iops": c.average_iops, "consistency": _finite(c.consistency),
        "stddev_iops": c.stddev_iops, "window_s": c.seconds, "short_window": c.short,
        "slow_share": c.slow_share, "slow_share_run": c.slow_share_run, "slow_ns": c.slow_ns,
        "steady_state": _steady_report(check), "round_iops": [float(x) for x in rounds],
        "round_s": max(1, int(round(round_s))), "last_rounds_steady": last.steady,
        "iops_series": [float(x) for x in series],
        "latency_distribution": scoring.latency_distribution(bins, window_s=int(window_s),
                                                             duration_ns=duration_ns),
    }


# The replayer's own lateness is worth a warning once it alone takes this share of a limit.
LATENESS_WARN = 0.1


def lateness_report(bins, period_s, duration_s) -> dict:
    """The replayer's own lateness beside an ACT verdict: per limit, the worst whole period's
    share of transactions issued later than the limit's latency (bins of act_bins(...,
    latency_from="lateness")), what part of the limit's allowance that is, and a warning
    when it reaches LATENESS_WARN of one. That much of the budget is spent before the drive
    sees the I/O: on a drive that keeps up, by the host's scheduling (the null engine at 1x
    measures it alone); on one that falls behind, also by waiting for a free in-flight slot."""
    periods = [p for p in scoring.qos(bins, period_s=period_s,
                                      duration_ns=int(duration_s * SECOND_NS))
               if p.seconds >= period_s]
    rows = []
    for threshold, limit in scoring.ACT_LIMITS:
        shares = [p.shares[int(threshold)] for p in periods if p.shares[int(threshold)] is not None]
        worst = max(shares) if shares else None
        rows.append({"over_ns": int(threshold), "limit": limit, "share": worst,
                     "of_limit": None if worst is None else worst / limit})
    worst = max((r for r in rows if r["of_limit"] is not None), key=lambda r: r["of_limit"],
                default=None)
    warning = None
    if worst and worst["of_limit"] >= LATENESS_WARN:
        warning = (f"the replayer itself issued {worst['share']:.2%} of transactions more than "
                   f"{worst['over_ns'] / 1e6:g} ms after they were due, {worst['of_limit']:.0%} of "
                   f"ACT's {worst['limit']:.1%} allowance spent before the drive saw them (host "
                   "scheduling, or the replayer's in-flight limit once the drive falls behind)")
    return {"limits": rows, "warning": warning}


def act_scores(bins, period_s, duration_s) -> dict:
    """One ACT run's verdict: scoring.act_check over its periods, and no transaction left
    unissued (an overloaded target that never got to them fails)."""
    check = scoring.act_check(bins, period_s=period_s, duration_ns=int(duration_s * SECOND_NS))
    reason = check.reason
    if bins.not_issued and check.passed:
        reason = f"{bins.not_issued} transactions were never issued: the target fell behind"
    return {"passed": check.passed and not bins.not_issued, "reason": reason,
            "not_issued": bins.not_issued,
            "periods": [{**asdict(p), "shares": [_finite(s) if not math.isnan(s) else None
                                                 for s in p.shares]} for p in check.periods]}


STEADY_BLOCK = 4096  # steady's 4 KiB random I/Os: its window's MB/s from its IOPS


def _power_keys(prefix: str, found: dict | None) -> dict:
    if not found:
        return {}
    return {f"{prefix}average_w": found["average_w"],
            f"{prefix}mb_per_s_per_w": found["mb_per_s_per_w"],
            f"{prefix}iops_per_w": found["iops_per_w"]}


def power_scores(test: str, scores: dict, runs: list[dict], prefix: str, log) -> dict:
    """The power of what a pass's charts headline, as scores (analysis.score_labels names
    them): a mix sweep's 70/30 point (average_w_70_30_1x32, ...), as seed 000's bars; steady's
    scored window, as seed 002's 70/30 efficiency (its average over that window, the run's
    steady IOPS at it); ACT's run at its passing multiple, as seed 000's ACT bars. `runs`: the
    set's runs with their power (analysis.power.measure); `prefix`: the pass's run names'
    (op_prefix); `log`: the power log, for steady's window."""
    watts = {r["name"]: r.get("power") for r in runs}
    out = {}
    if test == "mix":
        for row in scores.get("table", []):
            if row["read_share"] == 0.7:
                key = sweep_key((row["workers"], row["qd"]), row["data"])
                p = watts.get(prefix + row["run"])
                out.update({f"{k}_70_30_{key}": v for k, v in _power_keys("", p).items()})
    elif test == "steady" and scores.get("steady_iops") is not None and scores.get("window_s"):
        run = next((r for r in runs if r["name"] == prefix + "steady"), None)
        if run is not None:
            end = power.parse_when(run["started"]) + run["summary"]["duration_ns"] / 1e9
            iops, window = scores["steady_iops"], float(scores["window_s"])
            found = power.run_power(log, end - window, window, iops * STEADY_BLOCK / 1e6, iops)
            out.update(_power_keys("steady_", found))
            if found:
                out["steady_power_covered"] = found["covered_share"]
    elif test == "act" and scores.get("passed"):
        p = watts.get(prefix + f"act-x{scores['act_multiple']:g}")
        out.update(_power_keys("act_", p))
    return out


def format_results(results: dict) -> str:
    """A compact table of a results set's scores, for the console: each over-provisioned
    pass (--op) said before the scores it gave."""
    passes = results.get("op") or [{"op": 0, "scores": None}]
    lines = []
    for p in passes:
        if len(passes) > 1 or p["op"]:
            lines.append(_op_line(p))
        s = results["scores"] if p["scores"] is None else results["scores"].get(p["scores"], {})
        lines += _score_lines(results["test"], s)
    if results.get("power"):
        lines += _power_lines(results)
    return "\n".join(lines)


def _power_lines(results: dict) -> list[str]:
    """Each run's average power and efficiency (--power-log); a run the log does not cover
    says so."""
    lines = [f"power from {results['power']['log']}:",
             f"{'run':<26}{'W':>8}{'MB/s/W':>10}{'IOPS/W':>10}{'covered':>9}"]
    for run in results["runs"]:
        p = run.get("power")
        if p is None:
            lines.append(f"{run['name']:<26}{'not in the log':>22}")
            continue
        mb, io = p["mb_per_s_per_w"], p["iops_per_w"]
        lines.append(f"{run['name']:<26}{p['average_w']:>8.2f}"
                     f"{'-' if mb is None else f'{mb:,.1f}':>10}{'-' if io is None else f'{io:,.0f}':>10}"
                     f"{percent(p['covered_share']):>7} %")
    return lines


def _power_words(s: dict, prefix: str, more=()) -> list[str]:
    """The headline power scores (power_scores) of a steady or ACT pass, in words."""
    keys = [f"{prefix}{k}" for k in ("average_w", "mb_per_s_per_w", "iops_per_w")] + list(more)
    return [score_labels.words(k, s[k]) for k in keys if s.get(k) is not None]


def _op_line(p: dict) -> str:
    if not p["op"]:
        return "default capacity (no over-provisioning):"
    return (f"{p['op']} % over-provisioning: the whole target ({p['discarded_bytes']:,} bytes) "
            f"discarded, then every I/O in its first {p['limit_bytes']:,} bytes ({100 - p['op']} %):")


def _score_lines(test: str, s: dict) -> list[str]:
    lines = []
    if test in ("mix", "seqmix"):
        lines.append(f"{'run':<26}{'read %':>7}{'workers x QD':>13}{'IOPS':>12}{'MB/s':>10}{'p99 ms':>9}")
        for row in s.get("table", []):
            p99 = "-" if row["p99_ns"] is None else f"{row['p99_ns'] / 1e6:.2f}"
            split = f"{row['workers']} x {row['qd']}"
            lines.append(f"{row['run']:<26}{percent(row['read_share']):>7}{split:>13}"
                         f"{row['iops']:>12,.0f}{row['mb_per_s']:>10.1f}{p99:>9}")
        for key, value in score_labels.numeric(s).items():
            said = score_labels.words(key, value)
            if said and key != "read_share":
                lines.append(said + (" (the verdict's mix score)" if key == VERDICT_MIX_KEY else ""))
    elif test == "steady":
        ss = s.get("steady_state", {})
        if s.get("steady_iops") is not None:
            c = s.get("consistency")
            lines.append(f"steady IOPS (last {s['window_s']} s): {s['steady_iops']:,.0f}; "
                         f"consistency (average / stddev, seed 003's; assumed for seed 002): "
                         f"{'inf' if c is None else f'{c:.1f}'}")
        if s.get("slow_share") is not None:
            lines.append(f"I/Os over {s['slow_ns'] / 1e6:g} ms in the last {s['window_s']} s: "
                         f"{s['slow_share']:.3%}")
        if sum((s.get("latency_distribution") or {}).get("counts") or ()):
            lines.append(f"latency distribution of the last {s['window_s']} s: " + ", ".join(
                f"{name} {share:.2%}" for name, share in latency_ranges(s["latency_distribution"])))
        lines.append(f"SNIA steady state: {'reached at round ' + str(ss.get('round')) if ss.get('reached') else ss.get('status', '-')}"
                     f" (checked over {len(s.get('round_iops', ss.get('rounds', [])))} rounds"
                     + (f" of {s['round_s']:g} s" if s.get("round_s") else "") + "; the last "
                     f"{scoring.PTS_WINDOW} {'are' if s.get('last_rounds_steady') else 'are not'} steady)")
        for title, key in (("QD scaling", "qd_scaling"), ("read-share sweep", "table")):
            if s.get(key):
                lines.append(f"{title}: " + ", ".join(
                    f"{'QD' + str(r['qd']) if key == 'qd_scaling' else str(percent(r['read_share'])) + ' % reads'}"
                    f" {r['iops']:,.0f} IOPS" for r in s[key]))
        lines += _power_words(s, "steady_", ("steady_power_covered",))
    elif test == "act":
        if s.get("latency_definition"):
            lines.append(f"latency: {s['latency_definition']}")
        for p in s.get("periods", []):
            late = (p.get("lateness") or {}).get("limits") or []
            own = ", ".join(f"{r['share']:.3%} over {r['over_ns'] / 1e6:g} ms" for r in late
                            if r["share"] is not None)
            lines.append(f"x{p['multiple']:g}: {'pass' if p['passed'] else 'FAIL'}"
                         + (f" ({p['reason']})" if p["reason"] else "")
                         + (f"; replayer lateness alone: {own}" if own else ""))
            if (p.get("lateness") or {}).get("warning"):
                lines.append(f"  warning: {p['lateness']['warning']}")
        if "act_multiple" in s:
            lines.append(f"ACT score: {s['act_multiple']:g}x ({'passed' if s['passed'] else 'failed'})")
        if s.get("act_threads"):
            lines.append(f"at most {s['act_threads']} transactions outstanding (ACT's threads)")
        if act_chart.start_words(s):
            lines.append(act_chart.start_words(s))
        lines += _power_words(s, "act_")
    elif test == "pts":
        if s.get("purge"):
            lines.append(f"purge: {s['purge']['method']}; a PTS purge here: "
                         f"{ {True: 'yes', False: 'no', None: 'n/a'}[s['purge']['pts_purge']] } "
                         f"({s['purge']['why']})")
        lines.append(f"{'read %':>7}{'block':>8}{'IOPS':>12}")
        for row in s.get("iops_matrix", []):
            lines.append(f"{percent(row['read_share']):>7}{size_label(row['block_size']):>8}{row['iops']:>12,.0f}")
        ss = s.get("iops_steady_state", {})
        lines.append(f"steady state (4 KiB random writes): "
                     f"{'round ' + str(ss.get('round')) if ss.get('reached') else ss.get('status', '-')}")
        lines.append(f"{'read %':>7}{'block':>8}{'mean us':>10}{'max us':>10}")
        for row in s.get("latency", []):
            lines.append(f"{percent(row['read_share']):>7}{size_label(row['block_size']):>8}"
                         f"{row['mean_ns'] / 1e3:>10.1f}{row['max_ns'] / 1e3:>10.1f}")
    return lines
