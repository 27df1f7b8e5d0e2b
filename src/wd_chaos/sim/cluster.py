"""``wd-chaos sim --cluster ADDRESS``: seeds handed to a Dask distributed cluster, for sweeps larger
than one machine. Dask schedules, retries and moves the work; this module only cuts the seeds into
chunks (one task each, so the scheduler handles a few hundred tasks rather than a task per run) and
hands the verdicts back in seed order, as ``--jobs`` does. A cluster's workers need this package
installed (the same version: a seed's schedule is the code's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

CHUNK = 25
"""Seeds per Dask task: a simulated run is a few tenths of a second, a task's round trip through
the scheduler a few milliseconds."""


CONNECT_TIMEOUT = 30.0
"""Seconds to reach the cluster's scheduler before giving up (a harness failure)."""


class ClusterUnavailable(RuntimeError):
    """Dask is not installed, or the cluster at the address given could not be reached (the
    message names which and what to do)."""


def _judge_chunk(judge: Callable[[Any], Any], jobs: list[Any]) -> list[Any]:
    return [judge(job) for job in jobs]


def run_on_cluster(
    address: str, jobs: list[Any], judge: Callable[[Any], Any], *, connect_timeout: float | None = None
) -> Iterator[Any]:
    """Each job's verdict (``judge(job)``: a module-level function, which Dask pickles by name), in
    the order of ``jobs``, run on the Dask cluster whose scheduler listens at ``address``
    (``tcp://host:8786``). ``ClusterUnavailable``
    when Dask is missing or the scheduler cannot be reached; a task that fails on a worker raises
    its error here."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise ClusterUnavailable(
            "--cluster needs Dask distributed: pip install 'without-durability[cluster]'"
        ) from exc
    try:
        client = Client(address, timeout=connect_timeout or CONNECT_TIMEOUT, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as exc:
        raise ClusterUnavailable(f"no Dask scheduler reachable at {address!r}: {exc}") from exc
    with client:
        # at least four tasks per worker thread while there are seeds for them (a short sweep
        # still spreads over the cluster), at most CHUNK seeds each
        threads = sum(client.nthreads().values()) or 1  # type: ignore[no-untyped-call]
        size = max(1, min(CHUNK, len(jobs) // (threads * 4)))
        chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        # pure=False: two sweeps of the same seeds are two computations (a changed store, a
        # mutant), never a cached result
        futures = client.map(functools.partial(_judge_chunk, judge), chunks, pure=False)
        try:
            for future in futures:
                yield from future.result()
        finally:
            client.cancel(futures)  # type: ignore[no-untyped-call]
