"""Errors.

``Fenced``, ``Contended`` and ``Suspended`` say whether this pass may go on, not whether the work
failed, so they derive from ``BaseException`` like ``asyncio.CancelledError``: an ``except Exception``
written around a step (a declined card, a saga's rollback) must never absorb one. Everything else is
an ordinary ``Exception`` under ``WithoutDurabilityError``.
"""

from __future__ import annotations


class Fenced(BaseException):
    """A newer pass exists for this workflow: this pass may not write, and should stop at once.

    Raised by ``renew``, ``record`` and ``transact`` when the store has issued a higher token than the
    pass holds (or forgot the claim). Nothing was written.
    """

    def __init__(self, workflow: str, token: int, detail: str = "") -> None:
        self.workflow = workflow
        self.token = token
        msg = f"workflow {workflow!r}: pass with token {token} is fenced (a newer claim exists)"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class Contended(BaseException):
    """Another pass holds this workflow and is still alive; try again later. Nothing was changed."""

    def __init__(self, workflow: str) -> None:
        self.workflow = workflow
        super().__init__(f"workflow {workflow!r} is claimed by a live pass")


class Suspended(BaseException):
    """A workflow body reached a wait (a sleep, or a value it is awaiting). ``resume`` catches it."""


class WithoutDurabilityError(Exception):
    """Base of every ordinary error this library raises."""


class Swallowed(WithoutDurabilityError):
    """A workflow body went on after reaching a wait, so something absorbed its ``Suspended``
    (``gather(return_exceptions=True)``, ``asyncio.wait``, a bare ``except BaseException``).

    Raised by ``resume`` when such a body returns (``before`` is None), and by ``Run.step`` or
    ``Run.transact`` called after the wait (``before`` names its key): that effect did not run.
    """

    def __init__(self, workflow: str, waits: list[str], *, before: str | None = None) -> None:
        self.workflow = workflow
        self.waits = list(waits)
        self.before = before
        what = "returned" if before is None else f"called {before!r}"
        super().__init__(
            f"workflow {workflow!r} {what} after reaching wait(s) {self.waits!r}: something "
            "swallowed Suspended; let it propagate (do not gather waits with return_exceptions=True)"
            + ("" if before is None else f"; {before!r} did not run")
        )


class InvalidInput(WithoutDurabilityError, ValueError):
    """An argument the store refuses before touching anything; the message names it and the rule."""


class InvalidWorkflowId(InvalidInput):
    """A workflow id this store cannot hold."""


class InvalidKey(InvalidInput):
    """A record key that is refused (for example one under the store-named ``inbox/`` prefix)."""


class InvalidValue(InvalidInput):
    """A value the codec cannot encode, that does not survive it, or that is too large to store."""


class StoreError(WithoutDurabilityError):
    """The store failed; the driver's own error is kept as ``__cause__``."""


class StoreUnavailable(StoreError):
    """The store's server could not be reached. The message names where it looked."""


class SchemaMismatch(StoreError):
    """The database holds a schema this version does not understand; nothing was changed."""
