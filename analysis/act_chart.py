"""Aerospike ACT's chart as seed 000 draws it, from `replay bench act` scores: the passing
multiple per target, and per hour of the run at that multiple the share of transactions over
1, 8 and 64 ms beside ACT's limits; and where the search started, with the replayer's own lateness.
"""
import numpy as np

from analysis import plots  # first: it selects matplotlib's Agg backend
from analysis.scoring import ACT_LIMITS, MS_NS
import matplotlib.pyplot as plt  # noqa: E402  (isort: after plots)
from matplotlib.ticker import MaxNLocator  # noqa: E402

# The review's words for where its search starts.
REVIEW_START = 150


def scored_run(scores: dict) -> dict | None:
    """The run whose hours the chart shows: the one at the score (the highest passing multiple),
    else, when none passed, the last one tried (the lightest load, which failed too)."""
    runs = scores.get("periods") or []
    at_score = [r for r in runs if r.get("passed") and r.get("multiple") == scores.get("act_multiple")]
    return at_score[-1] if at_score else (runs[-1] if runs else None)


def hourly_shares(run: dict) -> list[list]:
    """[[share over 1 ms, over 8 ms, over 64 ms], ...] in percent, one row per whole period
    (hour) of `run`, in order; None where a period had no transactions. A partial last period
    is not scored, so not drawn."""
    return [[None if s is None else 100.0 * s for s in p["shares"]]
            for p in run.get("periods") or [] if not p.get("partial")]


def chart_data(sets: dict) -> dict:
    """{tag: ACT scores} -> what the chart draws: "score" {tag: passing multiple (0: none)}
    and "hours" {tag: {"multiple", "passed", "shares": hourly_shares}}."""
    score, hours = {}, {}
    for tag, scores in sets.items():
        if "act_multiple" not in scores:
            continue
        score[tag] = scores["act_multiple"] if scores.get("passed") else 0
        run = scored_run(scores)
        if run is not None:
            hours[tag] = {"multiple": run["multiple"], "passed": bool(run.get("passed")),
                          "shares": hourly_shares(run)}
    return {"score": score, "hours": hours}


def _lateness_words(run: dict | None) -> str:
    rows = ((run or {}).get("lateness") or {}).get("limits") or []
    if not rows or all(r["share"] is None for r in rows):
        return "no whole period ran there, so the replayer's own lateness was not scored"
    return ("the replayer's own lateness (its worst hour): " + ", ".join(
        ("-" if r["share"] is None else f"{r['share']:.3%}")
        + f" of transactions issued over {r['over_ns'] / MS_NS:g} ms late" for r in rows)
        + " (ACT allows " + ", ".join(f"{lim:.1%}" for _, lim in ACT_LIMITS) + ")")


def start_words(scores: dict) -> str | None:
    """Where the search started (the review's 150x, --multiple or --start), with the replayer's
    own lateness at that multiple beside it; for a single run, its multiple and lateness."""
    runs = scores.get("periods") or []
    if "search_start" in scores:
        start = scores["search_start"]
        source = ("--multiple" if scores.get("search_start_from") == "multiple" else
                  "the review's start, \"at least 150x\"" if start == REVIEW_START else "--start")
        what = f"the search started at {start:g}x ({source})"
    elif runs:
        start = runs[0]["multiple"]
        what = f"one run at {start:g}x (no search)"
    else:
        return None
    run = next((r for r in runs if r["multiple"] == start), None)
    return f"{what}; there {_lateness_words(run)}"


def figure(data: dict, colours: dict | None = None):
    """The chart: the passing multiple per target (bars), then per hour of the run at that
    multiple the share of transactions over 1, 8 and 64 ms, a line per target, with ACT's
    limit dashed. `colours`: {tag: colour}."""
    colours = colours or {}
    fig, axes = plt.subplots(1, 4, figsize=(13.0, 3.8), dpi=100, layout="constrained",
                             gridspec_kw={"width_ratios": [1.3, 1, 1, 1]})
    tags = list(data["score"])
    bars = axes[0]
    y = np.arange(len(tags))
    bars.barh(y, [data["score"][t] for t in tags], color=[colours.get(t) for t in tags])
    bars.set_yticks(y, tags, fontsize="small")
    bars.invert_yaxis()
    bars.set_xlim(0, max([1.0, *data["score"].values()]) * 1.2)
    bars.set_xlabel("passing multiple (x 1x load)")
    bars.set_title("ACT score")
    bars.grid(True, axis="x", alpha=0.3)
    for i, t in enumerate(tags):
        bars.annotate(f"{data['score'][t]:g}x", (data["score"][t], i), xytext=(3, 0),
                      textcoords="offset points", va="center", fontsize="small")
    for j, (ax, (threshold, limit)) in enumerate(zip(axes[1:], ACT_LIMITS)):
        for tag, h in data["hours"].items():
            shares = [np.nan if row[j] is None else row[j] for row in h["shares"]]
            hours = np.arange(1, len(shares) + 1)
            ax.plot(hours, shares, marker="o", color=colours.get(tag),
                    label=f"{tag} at {h['multiple']:g}x" + ("" if h["passed"] else " (failed)"))
        ax.axhline(100 * limit, color="black", linestyle="--", linewidth=1,
                   label=f"limit {100 * limit:g} %")
        ax.set_title(f"transactions over {threshold / MS_NS:g} ms")
        ax.set_xlabel("hour")
        ax.set_ylabel("share (%)")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend([h for h, lab in zip(handles, labels) if not lab.startswith("limit")],
               [lab for lab in labels if not lab.startswith("limit")] + [],
               loc="outside lower center", ncols=min(4, max(1, len(labels) - 1)), fontsize="small")
    axes[1].legend(handles[-1:], ["ACT's limit"], fontsize="x-small", loc="best")
    return fig


def report_figures(sets, colours: dict) -> list:
    """The report's ACT figure, as (name, caption, Figure), for its results sets of the act
    test (items with .tag, .label and .loaded.test/.scores); `colours`: {target label: colour}.
    The caption says where each search started, with the replayer's own lateness there."""
    acts = [it for it in sets if it.loaded.test == "act"]
    data = chart_data({it.tag: it.loaded.scores for it in acts})
    if not data["score"]:
        return []
    starts = [f"{it.tag}: {words}." for it in acts if (words := start_words(it.loaded.scores))]
    caption = ("Aerospike ACT as seed 000 draws it: the passing multiple per target, and per hour "
               "of the run at that multiple the share of transactions over 1, 8 and 64 ms, "
               "ACT's limits dashed. " + " ".join(starts))
    return [("act", caption, figure(data, {it.tag: colours.get(it.label) for it in acts}))]
