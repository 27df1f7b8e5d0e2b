"""``ProcrastinateScheduler``: the procrastinate job queue (https://procrastinate.readthedocs.io)
as without-durability's ``Scheduler``, through procrastinate's own ``JobManager`` on the pool the
kit opened, so that wd-chaos judges procrastinate's semantics, not a queue of ours.

A workflow is a procrastinate job of task ``wd.workflow`` whose ``task_kwargs`` name it, with
``lock`` and ``queueing_lock`` both set to ``namespace:workflow``: at most one job of a workflow
waits (``todo``) and at most one runs (``doing``), and the waiting one is not fetched while the
other runs. Every call is a documented ``JobManager`` method; the README lists where procrastinate's
semantics differ from the protocol and how each is mapped. Two choices are the kit's own and are
marked as such (``MAPPING:``) below. One of them, point 5 of the README, steps around what
procrastinate's issues #1446 and #1543 report (a retry refused by the queueing lock); with
``literal=True`` (the ``procrastinate-recipe`` kit) the kit does as procrastinate's documented
recipe does instead, so that wd-chaos shows what those reports describe.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector, exceptions
from procrastinate.jobs import Job, Status
from psycopg_pool import AsyncConnectionPool

from without_durability import Delivery, InvalidInput, InvalidWorkflowId
from without_durability.rules import check_time, check_visibility, check_workflow
from without_durability_postgres.errors import boundary, classify

TASK = "wd.workflow"
"""The task name every workflow's job carries (no procrastinate worker runs it: the kit fetches)."""


@dataclass(frozen=True)
class JobReceipt:
    """What a take handed out: the job's id and its ``attempts`` at the take (a retry, the
    holder's or a rescue's, adds one, so two takes of one job never hold equal receipts). The
    answers use the id only, as procrastinate's ``finish_job`` and ``retry_job`` do."""

    queue: str
    job: int
    attempts: int


def _driver_error(exc: BaseException) -> psycopg.Error | None:
    """The psycopg error procrastinate's ``ConnectorException`` wraps (its cause or context)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.Error):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


ABORTED_NOT_TODO = "check_not_todo_abort_requested"
"""procrastinate's check on ``procrastinate_jobs``: a job whose abort was requested is never ``todo``."""


def _aborted_retry(cause: psycopg.Error) -> bool:
    """The refusal of a retry that would put an abort-requested (cancelled) job back in ``todo``."""
    return isinstance(cause, psycopg.errors.CheckViolation) and cause.diag.constraint_name == ABORTED_NOT_TODO


class ProcrastinateScheduler:
    """``Scheduler`` over procrastinate's ``procrastinate_jobs`` in one queue (``namespace``)."""

    def __init__(
        self, app: App, pool: AsyncConnectionPool[Any], *, queue: str, worker_id: int, literal: bool = False
    ) -> None:
        self.app = app
        self.jobs = app.job_manager
        self.pool = pool
        self.queue = queue
        self.namespace = queue
        self.worker_id = worker_id
        self.literal = literal
        """True: a retry the queueing lock refuses is left refused, as procrastinate's "Retry
        stalled jobs" recipe and its worker leave it (the job stays ``doing``)."""

    # -- errors ------------------------------------------------------------------------------------

    @contextmanager
    def _boundary(self, what: str, workflow: str = "", *, refused_is_nothing: bool = False) -> Iterator[None]:
        """A procrastinate ``ConnectorException`` leaves as the store errors the built-in stores
        raise (``without_durability_postgres.errors.classify`` on the psycopg error it wraps);
        ``UniqueViolation`` (a queueing lock's refusal) leaves as itself, for the caller to map.

        With ``refused_is_nothing``: procrastinate's functions ``RAISE`` (SQLSTATE P0001) when the
        job is not in a state the call acts on ("Job was not found or not in "doing" status"):
        the call had nothing to act on, and the protocol's answer then changes nothing and raises
        nothing, so the error is swallowed here. So is a retry of a job whose abort was requested
        (a cancel while it was held) and that an earlier retry already ended ``failed``:
        ``procrastinate_retry_job_v2`` retries ``failed`` jobs too, and the table's
        ``check_not_todo_abort_requested`` constraint refuses to put the aborted job back in
        ``todo`` (CheckViolation); the job stays ``failed``, as a cancel since the take asks."""
        try:
            yield
        except exceptions.UniqueViolation:
            raise
        except exceptions.ConnectorException as exc:
            cause = _driver_error(exc)
            if cause is None:
                raise
            if refused_is_nothing and (
                isinstance(cause, psycopg.errors.RaiseException) or _aborted_retry(cause)
            ):
                return
            raise classify(cause, what, pool=self.pool, workflow=workflow) from cause

    def _lock(self, workflow: str) -> str:
        return f"{self.queue}:{workflow}"

    @staticmethod
    def _check(workflow: str) -> None:
        check_workflow(workflow)
        if "\x00" in workflow:  # Postgres text cannot hold NUL: refused here, before the server
            raise InvalidWorkflowId(
                f"workflow id {workflow!r} contains a NUL character; use an id without it"
            )

    # -- the protocol ------------------------------------------------------------------------------

    async def now(self) -> datetime:
        """The server's clock (procrastinate's ``scheduled_at <= now()`` is measured by it)."""
        with boundary("read the server clock", pool=self.pool):
            async with self.pool.connection() as conn:
                row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
        assert row is not None
        at: datetime = row[0]
        return at.astimezone(UTC)

    async def schedule(self, workflow: str, at: datetime | None = None) -> None:
        """``defer_job_async`` a job with the workflow's queueing lock. A waiting job already
        there makes procrastinate refuse the defer (``AlreadyEnqueued``); MAPPING: when the
        asked-for time is earlier than the waiting job's, the kit cancels that job
        (``cancel_job_by_id_async``, which acts only on a ``todo`` job) and defers again, so the
        earlier time wins, in calls that are not one transaction."""
        self._check(workflow)
        check_time("schedule at", at)
        for _ in range(5):
            job = Job(
                queue=self.queue,
                task_name=TASK,
                lock=self._lock(workflow),
                queueing_lock=self._lock(workflow),
                task_kwargs={"workflow": workflow},
                scheduled_at=at,
            )
            try:
                with self._boundary(f"defer {workflow!r}", workflow):
                    await self.jobs.defer_job_async(job)
                return
            except exceptions.AlreadyEnqueued:
                pass
            waiting = await self._waiting(workflow)
            if waiting is None:
                continue  # taken or cancelled since: defer again
            if waiting.scheduled_at is None:
                return  # the waiting job is due now (procrastinate's default): it stands
            if waiting.scheduled_at <= (at if at is not None else await self.now()):
                return  # the waiting job is due no later: it stands
            with self._boundary(f"cancel the waiting job of {workflow!r}", workflow):
                await self.jobs.cancel_job_by_id_async(int(waiting.id or 0), delete_job=True)
        # five refusals in a row: another caller keeps deferring the same workflow; one of theirs stands

    async def _waiting(self, workflow: str) -> Job | None:
        with self._boundary(f"list the jobs of {workflow!r}", workflow):
            found = await self.jobs.list_jobs_async(queueing_lock=self._lock(workflow), status="todo")
        return next(iter(found), None)

    async def take(self, visibility: timedelta) -> Delivery | None:
        """First the stalled-job rescue procrastinate documents (``get_stalled_jobs`` then
        ``retry_job`` for each), with the take's visibility as the stall age; then
        ``fetch_job``. procrastinate has no visibility timeout: a fetched job stays ``doing``
        until an answer or a rescue moves it."""
        check_visibility(visibility)
        await self._rescue(visibility)
        with self._boundary(f"fetch a job from queue {self.queue!r}"):
            job = await self.jobs.fetch_job(queues=[self.queue], worker_id=self.worker_id)
        if job is None:
            return None
        return Delivery(
            str(job.task_kwargs["workflow"]), JobReceipt(self.queue, int(job.id or 0), job.attempts)
        )

    async def _rescue(self, visibility: timedelta) -> None:
        with warnings.catch_warnings():  # nb_seconds is deprecated in 3.x (see the README)
            warnings.simplefilter("ignore", DeprecationWarning)
            with self._boundary(f"look for stalled jobs in queue {self.queue!r}"):
                stalled = await self.jobs.get_stalled_jobs(
                    nb_seconds=visibility.total_seconds(),  # type: ignore[arg-type]  # SQL takes a float
                    queue=self.queue,
                    task_name=TASK,
                )
        for job in stalled:
            try:
                # answered (or rescued by another take) since it was listed: nothing to retry
                with self._boundary(f"retry stalled job {job.id}", refused_is_nothing=True):
                    await self.jobs.retry_job(job)
            except exceptions.UniqueViolation:
                if self.literal:  # the recipe's retry_job raises here; the job stays doing
                    continue
                # MAPPING: a wakeup deferred the workflow's next job while this one was held, and
                # procrastinate refuses to put a second job of one queueing lock back in todo; the
                # waiting job is the workflow's reappearance, so the stalled one is ended as failed
                await self._end(job.id or 0, Status.FAILED, f"end stalled job {job.id}")

    async def _end(self, job_id: int, status: Status, what: str, workflow: str = "") -> None:
        with self._boundary(what, workflow, refused_is_nothing=True):
            await self.jobs.finish_job_by_id_async(job_id=job_id, status=status, delete_job=True)

    async def wake_at(self, delivery: Delivery, at: datetime | None) -> None:
        """Done: ``finish_job_by_id_async`` (succeeded, the job deleted). Again at ``at``:
        ``retry_job_by_id_async(id, at)``; where a wakeup deferred the workflow's next job while
        this one was held, procrastinate refuses (unique queueing lock) and the kit ends this job
        and schedules ``at`` (the earlier of the two stands). Both act by job id only. A retry
        of a cancelled job a first answer already ended is refused by procrastinate and changes
        nothing (``_boundary``)."""
        receipt = delivery.receipt
        if not isinstance(receipt, JobReceipt) or receipt.queue != self.queue:
            raise InvalidInput(f"{delivery!r} was not taken from procrastinate queue {self.queue!r}")
        check_time("wake at", at)
        workflow = delivery.workflow
        if at is None:
            await self._end(receipt.job, Status.SUCCEEDED, f"finish job {receipt.job}", workflow)
            return
        try:
            with self._boundary(f"retry job {receipt.job}", workflow, refused_is_nothing=True):
                await self.jobs.retry_job_by_id_async(job_id=receipt.job, retry_at=at)
        except exceptions.UniqueViolation as exc:
            if self.literal:  # as procrastinate's worker: the retry fails, the job stays doing
                cause = _driver_error(exc)
                assert cause is not None
                raise classify(
                    cause, f"retry job {receipt.job}", pool=self.pool, workflow=workflow
                ) from cause
            # MAPPING: a wakeup deferred the workflow's next job while this one was held; this
            # job ends and ``at`` is scheduled beside the waiting one (the earlier stands)
            await self._end(receipt.job, Status.SUCCEEDED, f"finish job {receipt.job}", workflow)
            await self.schedule(workflow, at)

    async def cancel(self, workflow: str) -> None:
        """``cancel_job_by_id_async`` on each of the workflow's jobs: a waiting one is deleted,
        a running one is marked for abort (``abort=True``), so its holder's retry ends it as
        failed instead of queueing it again."""
        self._check(workflow)
        with self._boundary(f"list the jobs of {workflow!r}", workflow):
            found = await self.jobs.list_jobs_async(queue=self.queue, lock=self._lock(workflow))
        for job in found:
            if job.status not in ("todo", "doing"):
                continue
            with self._boundary(f"cancel job {job.id}", workflow):
                await self.jobs.cancel_job_by_id_async(
                    int(job.id or 0), abort=job.status == "doing", delete_job=True
                )


async def open_app(pool: AsyncConnectionPool[Any]) -> App:
    """A procrastinate ``App`` on ``pool`` (``App.open_async(pool)``: the kit's pool, whose
    ``search_path`` is the run's schema, so procrastinate's tables live there)."""
    app = App(connector=PsycopgConnector())
    await app.open_async(pool)
    return app


async def apply_schema(app: App) -> None:
    """procrastinate's schema (``schema_manager.apply_schema_async``) in the pool's schema."""
    await app.schema_manager.apply_schema_async()
