"""The exceptions tracereplay raises for setup, configuration and input problems.

Per-I/O failures are never exceptions: they are data (a negative `result`). Every message
says what happened and what to do next; only the CLI prints them.
"""


class ReplayError(Exception):
    """Base of every error tracereplay raises on purpose."""


class TraceFormatError(ReplayError, ValueError):
    """A trace file is malformed: names the file, and where known the column and first bad row."""

    def __init__(self, path, problem, column=None, row=None):
        self.path, self.problem, self.column, self.row = str(path), problem, column, row
        where = "".join(
            part
            for part in (
                f", column '{column}'" if column is not None else "",
                f", row {row}" if row is not None else "",
            )
        )
        super().__init__(f"{self.path}{where}: {problem}")


class TargetError(ReplayError):
    """The target cannot be used as asked: too small, missing, not a file or device."""


class UnsafeTargetError(TargetError):
    """Writing to the target would destroy data that looks in use."""


class EngineUnavailable(ReplayError, OSError):
    """The requested I/O engine cannot run here (io_uring refused, extension missing)."""


class EngineSetupError(EngineUnavailable):
    """Raised by the Rust engine (native._engine) when the engine itself cannot start (the
    target opened fine), with errno set: e.g. EPERM where a seccomp profile refuses io_uring."""
