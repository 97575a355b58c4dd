"""The test suite, one folder per part of the code (traces, synth, analysis, replay, engine,
bench, cli). A package, so test modules import as `tests.<folder>.<module>` and the shared
helpers as `tests.cli_process`: no folder here can shadow the project's packages."""
