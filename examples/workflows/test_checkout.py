"""The checkout workflow's own tests, as a workflow author writes them (see
docs/tutorials/test-your-workflow.md):

    python -m pytest examples/workflows/test_checkout.py -q

``wd_workflow`` comes with the library's pytest plugin: it crashes the body at every step on a
store whose clock skips ahead, so the fourteen-day cooling-off period costs nothing.
"""

from __future__ import annotations

import checkout
import checkout_v2

from without_durability.testing import WorkflowKit

# --8<-- [start:tests]
ORDER = {"order": {"sku": "piano", "amount": 4200}}


async def test_checkout_survives_a_crash_anywhere(wd_workflow: WorkflowKit) -> None:
    report = await wd_workflow.check(checkout.checkout, inputs=ORDER, store="sqlite")
    assert report.valid, report.explain()
    assert report.result == {"held": 1, "charge": "ch-1", "shipment": "sh-1"}
    runs = {step.key: step.most_runs for step in report.steps}
    assert runs["reserve"] == 1  # a transact: exactly once, whatever crashed
    assert runs["charge"] == 2  # a step: a crash between the charge and its record charges again
    assert wd_workflow.ledger.most("charge") == 2  # so the gateway call carries an idempotency key


async def test_renaming_charge_would_charge_in_flight_orders_again(wd_workflow: WorkflowKit) -> None:
    report = await wd_workflow.check_upgrade(
        checkout_v2.checkout, checkout.checkout, inputs=ORDER, store="sqlite"
    )
    assert not report.valid
    assert report.problems[0].kind == "renamed" and report.problems[0].key == "charge"


# --8<-- [end:tests]
