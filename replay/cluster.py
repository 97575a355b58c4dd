"""Work beyond one process: a function over many files on local cores or as Ray tasks, and
(replay.multihost) replays spread over the hosts of a Ray cluster (replay.ray_session).
"""
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from replay.ray_session import LOCAL, ray_session
from traces.errors import ReplayError


@dataclass
class Done:
    """One item's outcome: `value` when it succeeded, else `error` (one line)."""

    index: int
    item: Any
    value: Any = None
    error: str | None = None


def _guarded(fn, item):
    """fn(item), its failure turned into data: a bad file must not stop the others."""
    try:
        return True, fn(item)
    except ReplayError as e:
        return False, str(e)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # noqa: BLE001 - a worker's bug is that file's error, named
        return False, f"{type(e).__name__}: {e}"


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_each(fn: Callable, items: list, cluster: str | None = None, jobs: int | None = None) -> Iterator[Done]:
    """fn(item) for every item, yielding each outcome as it finishes (not in order): as Ray
    tasks on the cluster at `cluster`, else on `jobs` local processes (default: one per
    core; one item or jobs=1 runs here). `fn` must be importable (a module's function).
    Ctrl-C cancels what has not finished and raises KeyboardInterrupt."""
    if cluster:
        yield from _ray_each(fn, items, cluster)
        return
    jobs = max(1, min(jobs or default_jobs(), len(items)))
    if jobs == 1:
        for i, item in enumerate(items):
            ok, value = _guarded(fn, item)
            yield Done(i, item, value if ok else None, None if ok else value)
        return
    import multiprocessing

    # forkserver: the workers start from a clean interpreter, not a fork of this one (which may
    # hold threads and Numba's state).
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("forkserver")) as pool:
        futures = {pool.submit(_guarded, fn, item): i for i, item in enumerate(items)}
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    i = futures[f]
                    try:
                        ok, value = f.result()
                    except Exception as e:  # noqa: BLE001 - a worker process died
                        ok, value = False, f"its worker process died ({type(e).__name__}: {e})"
                    yield Done(i, items[i], value if ok else None, None if ok else value)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _ray_each(fn, items, address):
    with ray_session(address) as ray:
        task = ray.remote(num_cpus=1, max_retries=1)(_guarded)
        refs = {task.remote(fn, item): i for i, item in enumerate(items)}
        pending = list(refs)
        try:
            while pending:
                # Short waits: Ctrl-C reaches Python only between them (ray.wait blocks in C++).
                ready, pending = ray.wait(pending, num_returns=1, timeout=0.2)
                for ref in ready:
                    i = refs[ref]
                    try:
                        ok, value = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        ok, value = False, f"its Ray task failed: {str(e).strip().splitlines()[0]}"
                    yield Done(i, items[i], value if ok else None, None if ok else value)
        except BaseException:
            # A cluster started for this command ends with it, its tasks too; cancelling them
            # there first once crashed Ray ("Tried to complete task that was not pending").
            if address != LOCAL:
                for ref in pending:
                    ray.cancel(ref)
            raise


def in_order(outcomes: Iterator[Done], count: int) -> Iterator[Done]:
    """The outcomes in item order, each yielded as soon as all before it have finished."""
    held, next_index = {}, 0
    for done in outcomes:
        held[done.index] = done
        while next_index in held:
            yield held.pop(next_index)
            next_index += 1
    for i in sorted(held):
        yield held[i]
