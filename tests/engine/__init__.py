"""Tests of the Rust engine through its Python boundary (replay._engine)."""
