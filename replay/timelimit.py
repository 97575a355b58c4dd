"""A run's time limit: it ends the run between chunks, or interrupts a wait on the engine."""
import signal
import threading
import time


class TimeUp(Exception):
    """The run reached its time limit (raised only while waiting on the engine)."""


class Deadline:
    """Ends a run at its time limit. Checked between chunks, and (in the main thread) an
    interval timer interrupts the waits on the engine, whose loops poll Python's signal
    handlers every few ms: without it, a full engine queue (4 chunks, seconds of I/O on a
    slow device) would overrun the limit. The handler raises only inside those waits, so
    it never lands half-way through writing a chunk."""

    def __init__(self, seconds, stops=None):
        self.seconds = seconds
        self.stops = stops  # StopSignals, whose signals also interrupt only the waits
        self.at = None
        self.passed = False
        self.waiting = False
        self._old = None

    def start(self):
        """Start the clock: at the first push, so that making the first chunk (loading a
        generator's Numba kernels takes a few hundred ms) does not eat a short run."""
        if self.seconds is None or self.at is not None:
            return
        self.at = time.monotonic() + float(self.seconds)
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, max(float(self.seconds), 1e-6))

    def _fire(self, signum, frame):
        self.passed = True
        if self.waiting:
            raise TimeUp

    def check(self):
        if self.at is not None and (self.passed or time.monotonic() >= self.at):
            self.passed = True
            raise TimeUp

    def wait(self, call, *args):
        """call(*args), interruptible by the time limit."""
        self.waiting = True  # first: a time-up from here on raises
        try:
            self.check()
            return self.stops.wait(call, *args) if self.stops else call(*args)
        finally:
            self.waiting = False

    def cancel(self):
        if self._old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
            self._old = None
