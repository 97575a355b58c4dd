"""Tests of replay/: running traces on targets, the results it keeps, remapping, clusters."""
