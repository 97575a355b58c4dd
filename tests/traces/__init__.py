"""Tests of traces/: the trace files, the bundled library and its catalog."""
