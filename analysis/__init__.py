"""Metrics, summaries and comparisons of replay results, trace characterisation and its
catalog, and the reports; above traces, beside synth.

The package's modules are the API; importing the package imports none of them.
"""

__all__ = ["act_chart", "analyse", "bench_charts", "catalog", "causal", "causal_kernel", "characterise", "compare",
           "fidelity", "histogram", "plots", "power", "report", "results", "score_labels", "scoring", "suite",
           "summary", "timeseries", "verdict"]
