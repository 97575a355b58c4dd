"""Traces: the schema, reading and writing Parquet traces, and the bundled trace library."""
