"""Tests of traces/capture/: the block-layer capture and its recipes."""
