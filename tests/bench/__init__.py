"""Tests of bench/: the scripts' promises and the two-drive pair."""
