"""Metrics, summaries and comparisons of replay results."""
