"""The bench runner: `replay bench`'s standard tests, driving synth's generators through the
replayer and scoring the runs as the reviews do, and `replay suite`, the library's captured
workloads replayed on one drive and scored as the reviews' real-use tests.

options (the tests, their options and the labels of runs), presets (each review's test as it
ran), session (Bench: one invocation, its runs recorded in results.json; run_bench), procedures
(what each test runs), scores (scoring and the console table), suite (Suite: the real-use
suite, into one results set). The package imports none of them
itself, so that `replay bench --help` loads no generator.
"""

__all__ = ["TESTS", "options", "presets", "procedures", "scores", "session", "suite"]

# The standard tests, by name (each a procedure in procedures.PROCEDURES): the one list, here
# so that the CLI takes its choices from it without loading the generators.
TESTS = ("mix", "seqmix", "steady", "act", "pts")
