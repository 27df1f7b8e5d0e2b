"""An order workflow, start to finish: reserve stock, charge the card, wait for a person to approve,
wait out a cooling-off period, ship.

    python examples/order.py                  # SQLite, in a temporary file
    python examples/order.py --sqlite shop.db
    python examples/order.py --postgres postgresql://user@127.0.0.1:5432/db
    python examples/order.py --redis redis://127.0.0.1:6379/0

The workflow runs in several passes. Each pass replays what is already recorded and stops at the
first thing it must wait for: the approval (from outside: ``durable.arrive``), then the cooling-off
period (``run.sleep``, on the store's clock). The worker answers each pass and picks the workflow up
again when it is due. Stock is reserved once however many passes replay it, because reserving is a
``transact`` (the store moves the stock and records the result in one commit); the card is charged
once because the charge is a ``step`` with an idempotency key.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import timedelta
from typing import Any

from _shop import Service, Shop, as_dict, open_shop, parse_args

from without_durability import Run, Worker

COOLING_OFF = timedelta(seconds=2)


def order_workflow(
    shop: Shop, gateway: Service, carrier: Service, finished: dict[str, object]
) -> Any:
    async def body(run: Run[Any]) -> object:
        def say(what: str) -> None:
            print(f"  [{run.workflow} pass {run.pass_.token}] {what}")

        order = await run.awaiting("order", as_dict)  # supplied when the order was placed
        reservation = await run.transact(
            "reserve", shop.reserve(run.workflow, order["sku"], order["qty"]), as_dict
        )
        if not reservation["reserved"]:
            finished[run.workflow] = {"status": "out of stock"}
            return finished[run.workflow]
        say(f"{order['qty']} x {order['sku']} reserved (the order holds {reservation['held']})")

        async def charge() -> object:
            return await gateway.call(f"{run.workflow}/charge", amount=order["amount"])

        payment = await run.step("charge", charge, as_dict)
        say(f"charged {payment['amount']} as {payment['id']}; waiting for approval")
        approval = await run.awaiting("approval", as_dict)
        say(f"approved by {approval['by']}; cooling off for {COOLING_OFF}")
        until = await run.sleep("cooling-off", COOLING_OFF)
        say(f"cooling-off ended at {until.isoformat(timespec='seconds')}")

        async def ship() -> object:
            return await carrier.call(f"{run.workflow}/ship", sku=order["sku"], qty=order["qty"])

        shipment = await run.step("ship", ship, as_dict)
        say(f"shipped as {shipment['id']}")
        finished[run.workflow] = {"status": "shipped", "charge": payment["id"],
                                  "shipment": shipment["id"]}
        return finished[run.workflow]

    return body


async def approve_when_charged(shop: Shop, order_id: str) -> None:
    """A person outside the worker: they look at the order now and then, and once it shows its
    charge they approve it. (They only know what the store tells them, so they poll it.)"""
    async with asyncio.timeout(30):
        while True:
            if "charge" in await shop.durable.checkpointer.load(order_id):
                break
            await asyncio.sleep(0.1)
    print(f"  [approver] approving {order_id}")
    await shop.durable.arrive(order_id, "approval", {"by": "alice", "approved": True})


async def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    gateway, carrier = Service("charge"), Service("shipment")
    finished: dict[str, object] = {}
    async with open_shop(args) as shop:
        print(f"store: {shop.name}")
        suffix = uuid.uuid4().hex[:8]
        order_id, sku = f"order-{suffix}", f"piano-{suffix}"
        await shop.stock_in(sku, 3)
        await shop.durable.arrive(order_id, "order", {"sku": sku, "qty": 1, "amount": 4200})
        print(f"placed {order_id}")
        worker = Worker(
            shop.durable, order_workflow(shop, gateway, carrier, finished),
            alive=timedelta(seconds=5), budget=timedelta(minutes=1),
            visibility=timedelta(minutes=2), poll_interval=timedelta(milliseconds=100),
        )
        await asyncio.gather(
            worker.run(until=lambda: order_id in finished),
            approve_when_charged(shop, order_id),
        )
        print(f"result: {finished[order_id]}")
        print("history:")
        for entry in await shop.durable.checkpointer.history(order_id):
            print(f"  {entry.written_at.isoformat(timespec='milliseconds')}  "
                  f"{entry.key:<12} {entry.value}")
        held = await shop.held(order_id, sku)
        checks = {
            f"stock reserved once over {worker.passes} passes": held == 1,
            f"card charged once ({gateway.calls} call(s))": gateway.performed == 1,
            f"shipped once ({carrier.calls} call(s))": carrier.performed == 1,
        }
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
