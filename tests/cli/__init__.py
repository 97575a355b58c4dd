"""Tests of the `replay` command line as a user meets it, in real processes."""
