"""The progress ticker: a run's progress callback, called from a thread while it goes."""
import _thread
import contextlib
import signal
import threading
import time

# How often `progress` is called while a run goes.
PROGRESS_S = 0.25


class Ticker:
    """Calls `progress(rows_done, rows_total, elapsed_s)` every PROGRESS_S seconds, from a
    thread, from the start of the run to its end, with the rows the engines have completed."""

    def __init__(self, progress, merger, total):
        self.progress, self.merger, self.total = progress, merger, total
        self._engines = [rep.progress() for rep in merger.reps]
        self.running = False
        self._stop = threading.Event()
        self._thread = None
        self._start_ns = 0

    def start(self, start_ns: int):
        self.running = True
        self._start_ns = start_ns
        if self.progress is not None:
            self._thread = threading.Thread(target=self._loop, name="replay-progress", daemon=True)
            self._thread.start()

    def _loop(self):
        while True:
            try:
                self.tick()
            except KeyboardInterrupt:
                # A callback that interrupts (as a UI's cancel button may) stops the run as
                # Ctrl-C does: the main thread gets the SIGINT it would have had.
                _thread.interrupt_main(signal.SIGINT)
                return
            if self._stop.wait(PROGRESS_S):
                return

    def done(self) -> int:
        # The engines count the rows they completed, so progress moves between the chunks
        # they hand back (65,536 rows, seconds of I/O on a slow drive).
        done = max(self.merger.done, sum(p.completed() for p in self._engines))
        return done if self.total is None else min(done, self.total)

    def tick(self):
        elapsed_ns = max(time.monotonic_ns() - self._start_ns, 0)
        self.progress(self.done(), self.total, elapsed_ns / 1e9)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            with contextlib.suppress(KeyboardInterrupt):  # the run is over: nothing to stop
                self.tick()
