"""A checkout workflow to test before deploying it (see docs/tutorials/test-your-workflow.md).

    wd-chaos workflow examples/workflows/checkout.py:checkout --store sqlite \
        --input '{"order": {"sku": "piano", "amount": 4200}}'

It waits for the order, reserves stock in the store (a ``transact``: exactly once), charges the
card (a ``step``: a crash between the charge and its record charges again, so the gateway gets an
idempotency key), waits out a fourteen-day cooling-off period (the kit skips the time), and ships.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

from without_durability import Run

GATEWAY_CALLS: list[str] = []
"""Stands in for a payment gateway: every charge it was asked for, by idempotency key."""


def reserve(cursor: sqlite3.Cursor) -> object:
    # runs inside the store's own write transaction: the stock moves and the record lands together
    cursor.execute("CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, held INTEGER)")
    cursor.execute("INSERT INTO stock VALUES ('piano', 1) ON CONFLICT (sku) DO UPDATE SET held = held + 1")
    return cursor.execute("SELECT held FROM stock WHERE sku = 'piano'").fetchone()[0]


def as_dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {value!r}")
    return value


async def checkout(run: Run[Any]) -> object:
    order = await run.awaiting("order", as_dict)
    held = await run.transact("reserve", reserve, int)

    async def charge() -> object:
        GATEWAY_CALLS.append(f"{run.workflow}/charge")  # the key makes a repeated call harmless
        return {"id": "ch-1", "amount": order["amount"]}

    payment = await run.step("charge", charge, as_dict)
    await run.sleep("cooling-off", timedelta(days=14))

    async def ship() -> object:
        return {"id": "sh-1", "sku": order["sku"]}

    shipment = await run.step("ship", ship, as_dict)
    return {"held": held, "charge": payment["id"], "shipment": shipment["id"]}
