"""Tests of traces/formats/: each import and export format against real files."""
