"""SIGTERM and SIGHUP (from `timeout`, systemd, `docker stop`, a closed terminal) end a run
as Ctrl-C does: they raise `Interrupted`, a KeyboardInterrupt that remembers its signal, so
every path that keeps a run's rows on Ctrl-C keeps them on these too.
"""
import functools
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; `signum` says which (the exit status is 128 + signum)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def signum_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: SIGINT unless it is an `Interrupted`."""
    return getattr(exc, "signum", signal.SIGINT)


def exit_status(signum: int) -> int:
    """The shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + int(signum)


def name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class StopSignals:
    """While entered (in the main thread), SIGINT, SIGTERM and SIGHUP raise `Interrupted`.

    While `defer` is set (it may be set once entered) they only raise inside `wait(...)`
    calls (the waits on the engine), and elsewhere are remembered in `received` for
    `check()` or the caller: a signal then never lands half-way through writing a chunk,
    closing the results or removing a scratch file. A second signal while `defer` is set
    also waits for `wait` or `check`. A handler someone else installed (a signal that is ignored, as
    under nohup, or a program's own handler) is left alone; ours are replaced and restored,
    so these nest.
    """

    last: int | None = None  # the last signal any of them received, for an exit status

    def __init__(self, defer: bool = False):
        self.defer = defer
        self.received: int | None = None
        self.waiting = False
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                current = signal.getsignal(sig)
                if current in (signal.SIG_DFL, signal.default_int_handler) or _ours(current):
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def _handle(self, signum, frame):
        StopSignals.last = signum
        if self.received is None:
            self.received = signum
        if not self.defer or self.waiting:
            raise Interrupted(signum)

    def check(self):
        """Raise `Interrupted` if a signal came since entering."""
        if self.received is not None:
            raise Interrupted(self.received)

    def wait(self, call, *args):
        """call(*args), which a signal may interrupt."""
        self.waiting = True  # first: a signal from here on raises, none slips in unseen
        try:
            self.check()
            return call(*args)
        finally:
            self.waiting = False


def _ours(handler) -> bool:
    return getattr(handler, "__func__", None) is StopSignals._handle


def stop_signals(fn):
    """SIGTERM and SIGHUP end the call as Ctrl-C does (a KeyboardInterrupt, `Interrupted`),
    so a scratch target and everything else set up is removed on them too."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with StopSignals():
            return fn(*args, **kwargs)
    return wrapper
