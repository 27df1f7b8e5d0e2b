"""A deterministic asyncio event loop: a seeded choice of the next ready callback, virtual time.

asyncio's Tasks, Futures, ``sleep``, ``wait_for``, ``Event`` and ``TaskGroup`` run on any loop that
offers ``call_soon``, ``call_at``, ``time`` and ``create_future``; this is such a loop, and nothing
more. It does no I/O and starts no thread (``run_in_executor`` and the like raise), so a run on it is
a pure function of its seed:

- the next callback is drawn from every ready one by the seeded RNG, not taken first in first out,
  so each seed interleaves the tasks its own way, and the same seed the same way;
- time is virtual: when nothing is ready the clock jumps to the next timer, so a lease lapses and a
  poll interval passes without waiting; each callback also costs a small random slice of virtual
  time, so two operations never share an instant by accident;
- every callback belongs to a *process* (the ``PROCESS`` context variable its task was started
  under; a task's children inherit it). ``crash`` drops a process's callbacks for ever (its tasks
  vanish mid-await, as under SIGKILL: no ``finally`` runs); ``stall`` holds them until a time (as
  SIGSTOP/SIGCONT), while the other processes and the clock go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import heapq
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

TEARDOWN_ROUNDS = 8
"""How many times ``SimLoop.teardown`` closes what is still running before it gives up."""


def _running(task: asyncio.Task[Any]) -> bool:
    """Whether ``task``'s coroutine has not ended (a closed one has no frame)."""
    coro = task.get_coro()
    return getattr(coro, "cr_frame", None) is not None


PROCESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("wd_sim_process", default=None)
"""The simulated process a task runs in (None: the simulator itself, which never crashes)."""

STEP_COST = 20e-6
"""The most virtual time (seconds) one callback costs; each costs a seeded fraction of it."""


class _Handle(asyncio.Handle):
    """``asyncio.Handle`` without the debug-mode lookup its constructor makes (this loop is never
    in debug mode): a run makes tens of thousands. Behaves as a Handle in every other way."""

    __slots__ = ()

    def __init__(
        self,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        context: contextvars.Context | None = None,
    ) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class NotSimulated(RuntimeError):
    """A loop feature a simulated run must not use (threads, sockets, signals): real I/O would make
    the run depend on more than its seed. The message names the call."""


class SimLoop(asyncio.AbstractEventLoop):
    """An asyncio loop on virtual time whose next ready callback the seeded ``rng`` picks. Run a
    coroutine with ``run_until_complete``; see the module docstring for what a caller may rely on."""

    def __init__(self, rng: random.Random, *, start: float = 1000.0) -> None:
        self.rng = rng
        self._now = start
        self._ready: list[asyncio.Handle] = []
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._seq = 0
        self._dead: set[str] = set()
        self._stalled: dict[str, float] = {}
        self._frozen: dict[str, list[asyncio.Handle]] = {}
        self._running = False
        self._closed = False
        self._tasks: list[asyncio.Task[Any]] = []
        self.errors: list[dict[str, Any]] = []
        """What ``call_exception_handler`` was given (a task whose exception nobody retrieved)."""
        self.steps = 0
        """Callbacks run so far."""
        self.free: str | None = None
        """A process whose callbacks cost no virtual time (``STEP_COST``): set while the retake
        probe runs, so its calls happen at instants it chose."""

    # -- processes -------------------------------------------------------------------------------

    def crash(self, process: str) -> None:
        """Drop every callback of ``process``, now and later: its tasks never run again."""
        self._dead.add(process)
        self._frozen.pop(process, None)

    def stall(self, process: str, until: float) -> None:
        """Hold ``process``'s callbacks until the virtual time ``until``; then they run again."""
        self._stalled[process] = max(until, self._stalled.get(process, until))
        self.call_at(until, self._thaw, process, context=contextvars.Context())

    def resume(self, process: str) -> None:
        """End a ``stall`` of ``process`` now (SIGCONT before its time): its held callbacks run again."""
        if self._stalled.pop(process, None) is not None:
            self._ready.extend(self._frozen.pop(process, []))

    def crashed(self, process: str) -> bool:
        """Whether ``crash`` has been called for ``process``."""
        return process in self._dead

    def stalled(self, process: str) -> bool:
        """Whether ``process`` is held by ``stall`` now."""
        return self._stalled.get(process, -1.0) > self._now

    def _thaw(self, process: str) -> None:
        if self.stalled(process):
            return  # stalled again since, for longer
        self._stalled.pop(process, None)
        self._ready.extend(self._frozen.pop(process, []))

    # -- what asyncio asks of a loop -------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return self.call_at(self._now + max(0.0, delay), callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, handle))
        return handle

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        pass  # dropped when it comes due

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(
        self, coro: Any, *, name: str | None = None, context: contextvars.Context | None = None
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=self, name=name, context=context)
        # held until teardown: a crashed process's task collected mid-run would run its finally
        # blocks at a moment the garbage collector picks, and the run would depend on it
        self._tasks.append(task)
        return task

    def get_debug(self) -> bool:
        return False

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._ready.clear()
        self._timers.clear()
        self._frozen.clear()
        self._tasks.clear()

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def get_exception_handler(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        # every other loop method (sockets, threads, subprocesses, signals) is real I/O
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise NotSimulated(f"SimLoop.{name}: a simulated run does no I/O and starts no thread")

        return refuse

    # -- running ---------------------------------------------------------------------------------

    def _due(self) -> None:
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            _, _, handle = heapq.heappop(timers)
            if not handle.cancelled():
                self._ready.append(handle)

    def _step(self) -> bool:
        """Run one callback (jumping the clock to the next timer if none is ready); False when
        nothing is left to run."""
        return self._run(None, 1)

    def _run(self, task: asyncio.Future[Any] | None, limit: int) -> bool:
        """Run callbacks until ``task`` is done (or ``limit`` callbacks were looked at, with no
        task); False when nothing is left to run. ``_step`` inlined into one loop: a run is
        thousands of callbacks, and the draws are the very ones ``randrange`` and ``random`` make
        (``randrange(n)`` is ``getrandbits(n.bit_length())`` drawn again while ``>= n``), so a
        seed interleaves as it always has."""
        ready = self._ready
        timers = self._timers
        dead = self._dead
        stalled = self._stalled
        frozen = self._frozen
        getrandbits = self.rng.getrandbits
        random_ = self.rng.random
        heappop = heapq.heappop
        process = PROCESS
        looked = 0
        while (task is None and looked < limit) or (task is not None and not task.done()):
            looked += 1
            if not ready:
                while timers and not ready:
                    when, _, timer = heappop(timers)
                    if timer._cancelled:
                        continue
                    if when > self._now:
                        self._now = when
                    ready.append(timer)
                    self._due()
                if not ready:
                    return False
            n = len(ready)
            k = n.bit_length()
            index = getrandbits(k)
            while index >= n:
                index = getrandbits(k)
            last = ready.pop()
            if index == n - 1:
                handle = last
            else:
                handle = ready[index]
                ready[index] = last
            if handle._cancelled:
                continue
            owner = handle._context.get(process)  # type: ignore[attr-defined]
            if owner is not None:
                if owner in dead:
                    continue
                if stalled and stalled.get(owner, -1.0) > self._now:
                    frozen.setdefault(owner, []).append(handle)
                    continue
            self.steps += 1
            if owner is None or owner != self.free:
                self._now += random_() * STEP_COST
            try:  # Handle._run, inlined: one frame less for each of a run's callbacks
                handle._context.run(handle._callback, *handle._args)  # type: ignore[attr-defined]
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                callback = handle._callback  # type: ignore[attr-defined]
                message = f"Exception in callback {callback!r}"
                self.call_exception_handler({"message": message, "exception": exc, "handle": handle})
            if timers and timers[0][0] <= self._now:
                self._due()
        return True

    def run_until_complete(self, future: Any) -> Any:
        """Run ``future`` (a coroutine or a future) until it is done; its result. A run where
        every task waits and no timer is set raises ``RuntimeError`` (a deadlock)."""
        task: asyncio.Future[Any] = asyncio.ensure_future(future, loop=self)
        previous = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self)
        self._running = True
        collecting = gc.isenabled()
        gc.disable()  # no finalizer may run at a moment the collector picks
        try:
            if not self._run(task, 0):
                raise RuntimeError("SimLoop: every task is waiting and no timer is set (a deadlock)")
        finally:
            if collecting:
                gc.enable()
            self._running = False
            asyncio.events._set_running_loop(previous)
        return task.result()

    def teardown(self) -> None:
        """Close every task still pending (a crashed process's, a worker never stopped) while this
        loop is current, so their coroutines end here rather than when collected, and close.

        Closing a coroutine runs its ``finally`` blocks, and one that awaits there (a worker waiting
        for its renewal tick to end) cannot finish under a close: Python turns the close into a
        ``RuntimeError`` inside the awaiting caller, which may carry on and start new tasks (the
        worker's next poll). So the close is repeated, in creation order, until no coroutine is
        left running and no new task appeared, at most ``TEARDOWN_ROUNDS`` times."""
        asyncio.events._set_running_loop(self)
        try:
            for _ in range(TEARDOWN_ROUNDS):
                made = set(self._tasks)
                known = [*self._tasks, *(t for t in asyncio.all_tasks(self) if t not in made)]
                open_ = [t for t in known if _running(t)]
                if not open_:
                    break
                for task in open_:
                    coro = task.get_coro()
                    with contextlib.suppress(BaseException):
                        if coro is not None and hasattr(coro, "close"):
                            coro.close()
                    with contextlib.suppress(BaseException):
                        task.cancel()
                        task._log_destroy_pending = False  # type: ignore[attr-defined]
        finally:
            asyncio.events._set_running_loop(None)
        self.close()

    def run_forever(self) -> None:
        raise NotSimulated("SimLoop.run_forever: use run_until_complete")


def run(coro: Coroutine[Any, Any, T], rng: random.Random) -> tuple[T, SimLoop]:
    """Run ``coro`` to its end on a fresh ``SimLoop`` drawing on ``rng``; the result and the loop."""
    loop = SimLoop(rng)  # type: ignore[abstract]  # the I/O methods refuse through __getattr__
    try:
        result: T = loop.run_until_complete(coro)
        return result, loop
    finally:
        loop.close()
