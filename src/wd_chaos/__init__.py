"""wd-chaos: a Jepsen-style fault-injection harness for without-durability's stores.

A *workload* of real worker processes runs a test workflow against a real store while a *nemesis*
stalls them past their leases (SIGSTOP), kills them at failpoints (SIGKILL), cuts their network
(toxiproxy) or restarts the store; every process writes a *history* of invoke/complete operations;
*checkers* read the history and the store's final state and return valid, invalid or unknown with
the operations that prove it; a *report* stores the run so ``wd-chaos analyze`` can re-check it.
"""

from __future__ import annotations

__version__ = "0.1.0"
