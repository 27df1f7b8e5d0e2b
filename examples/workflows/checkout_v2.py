"""The checkout workflow's next version, which renames the step ``charge`` to ``charge-card``.

    wd-chaos workflow examples/workflows/checkout_v2.py:checkout --store sqlite \
        --input '{"order": {"sku": "piano", "amount": 4200}}' \
        --replay-against examples/workflows/checkout.py:checkout

Crash-safe on its own, but not as a deploy: an order the old version charged and left waiting out
its cooling-off period finds no ``charge-card`` record and is charged again. The check exits 1
naming ``charge``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from checkout import as_dict, reserve

from without_durability import Run


async def checkout(run: Run[Any]) -> object:
    order = await run.awaiting("order", as_dict)
    held = await run.transact("reserve", reserve, int)

    async def charge() -> object:
        return {"id": "ch-1", "amount": order["amount"]}

    payment = await run.step("charge-card", charge, as_dict)  # renamed: in-flight orders charge twice
    await run.sleep("cooling-off", timedelta(days=14))

    async def ship() -> object:
        return {"id": "sh-1", "sku": order["sku"]}

    shipment = await run.step("ship", ship, as_dict)
    return {"held": held, "charge": payment["id"], "shipment": shipment["id"]}
