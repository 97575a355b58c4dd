"""Traces, the bottom floor: the schema, the errors every package raises, reading and writing
Parquet traces, the bundled trace library, targets and their write-safety checks, where an
output may be written (outputs), temporary directories a later run can tell are orphaned
(workdirs); above those,
the foreign formats (import and export) and capture.

The packages' modules are the API; importing the package imports none of them.
"""

__all__ = ["capture", "convert", "errors", "formats", "library", "outputs", "schema", "targets", "trace", "kernel_types", "units", "workdirs"]
