"""tracereplay: replay block I/O traces against drives and files, recording every I/O's timing."""

# The package's modules are the API; importing the package imports none of them (the CLI's
# --help stays fast). The top floor: the replayer, then the bench runner and the CLI.
__all__ = ["__version__", "bench", "calibrate", "cli", "cli_reference", "cluster", "commands", "engines",
           "merger", "multihost", "options", "output", "progress", "remap", "runner", "signals", "sources",
           "targets", "timelimit"]

__version__ = "0.1.0"
