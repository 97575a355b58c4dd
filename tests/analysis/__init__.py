"""Tests of analysis/: metrics, comparisons, scores, causal inference and reports."""
