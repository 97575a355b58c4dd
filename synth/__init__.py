"""Synthetic workload generators that emit traces in the common schema."""
