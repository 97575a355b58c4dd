"""Tests of replay/: running traces on targets, the results it keeps, remapping, clusters, and
the bench runner that drives the generators through it."""
