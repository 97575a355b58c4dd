"""Tests of synth/: the generators."""
