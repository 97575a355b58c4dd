"""Tests of synth/: the generators and the bench runner that drives them."""
