"""Metrics, summaries and comparisons of replay results, trace characterisation and its
catalog, and the reports; above traces, beside synth.

The package's modules are the API; importing the package imports none of them.
"""

__all__ = ["act_chart", "analyse", "catalog", "causal", "causal_kernel", "characterise", "compare", "fidelity", "histogram",
           "plots", "power", "report", "results", "scoring", "suite", "summary", "timeseries", "verdict"]
