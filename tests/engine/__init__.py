"""Tests of the Rust engine through its Python boundary (native._engine)."""
