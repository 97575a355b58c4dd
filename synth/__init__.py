"""Synthetic workload generators that emit traces in the common schema; above traces, beside
analysis. What runs them on a target is the bench runner, replay.bench.

The package's modules are the API; importing the package imports none of them.
"""

__all__ = ["demo", "generators"]
