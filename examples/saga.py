"""A saga: book a trip (reserve a seat, charge the card, book the hotel) and, if a step fails, undo
what was done. Then the case that shapes it: a forward pass that is fenced must not compensate.

    python examples/saga.py                   # SQLite, in a temporary file
    python examples/saga.py --sqlite trip.db
    python examples/saga.py --postgres postgresql://user@127.0.0.1:5432/db
    python examples/saga.py --redis redis://127.0.0.1:6379/0

The saga is an ``except Exception`` around the forward steps. ``Fenced`` is a ``BaseException``, so
it passes through that ``except`` untouched: a fenced pass is not a failed trip, it is a pass that
lost the workflow to a newer one, which may be building on the very charge a rollback would refund.

1. The hotel is full: the saga refunds the charge and releases the seat, once.
2. The first pass stalls inside the charge for longer than its claim's window (as a process does
   when it is stopped or swapped out), a second worker claims the workflow and books the trip, and
   the first pass wakes to find itself fenced: its record is refused, and it refunds nothing.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import timedelta
from typing import Any

from _shop import Service, ServiceDeclined, Shop, as_dict, open_shop, parse_args

from without_durability import Fenced, Run, Worker, resume

ALIVE = timedelta(milliseconds=500)


class Trip:
    """The services a trip touches, and what happened to each workflow."""

    def __init__(self, shop: Shop, *, hotel_full: bool) -> None:
        self.shop = shop
        self.gateway = Service("charge")
        self.refunds = Service("refund")
        self.hotel = Service("hotel", fail_with="no rooms left" if hotel_full else None)
        self.finished: dict[str, object] = {}
        self.stall: dict[str, float] = {}
        """Workflow -> seconds: its first charge stalls that long after calling the gateway."""

    async def body(self, run: Run[Any]) -> object:
        def say(what: str) -> None:
            print(f"  [{run.workflow} pass {run.pass_.token}] {what}")

        trip = await run.awaiting("trip", as_dict)
        try:
            seat = await run.transact(
                "seat", self.shop.reserve(run.workflow, trip["flight"], 1), as_dict
            )
            if not seat["reserved"]:
                raise ServiceDeclined(f"flight {trip['flight']} is full")

            async def charge() -> object:
                paid = await self.gateway.call(f"{run.workflow}/charge", amount=trip["amount"])
                stall = self.stall.pop(run.workflow, 0.0)
                if stall:
                    say(f"charged {paid['id']}, then stalled for {stall}s (nobody renews)")
                    await asyncio.sleep(stall)
                    say("woke up; recording the charge")
                return paid

            payment = await run.step("charge", charge, as_dict)
            say(f"charged {payment['id']}")

            async def book() -> object:
                return await self.hotel.call(f"{run.workflow}/hotel", nights=trip["nights"])

            booking = await run.step("hotel", book, as_dict)
            say(f"hotel booked as {booking['id']}")
            result: object = {"status": "booked", "charge": payment["id"], "hotel": booking["id"]}
        except Exception as failure:  # a failed trip: undo, newest first; Fenced never gets here
            say(f"{failure}: compensating")
            if run.recorded("charge"):

                async def refund() -> object:
                    return await self.refunds.call(f"{run.workflow}/refund", amount=trip["amount"])

                await run.step("refund", refund, as_dict)
                say("refunded the charge")
            if run.recorded("seat"):
                await run.transact(
                    "seat-back", self.shop.unreserve(run.workflow, trip["flight"], 1), as_dict
                )
                say("released the seat")
            result = {"status": "rolled back", "reason": str(failure)}
        self.finished[run.workflow] = result
        return result


async def new_trip(shop: Shop) -> tuple[str, str]:
    """A fresh workflow id and a flight with ten free seats."""
    suffix = uuid.uuid4().hex[:8]
    await shop.stock_in(f"flight-{suffix}", 10)
    return f"trip-{suffix}", f"flight-{suffix}"


def worker(trip: Trip) -> Worker[Any]:
    return Worker(
        trip.shop.durable, trip.body, alive=ALIVE, budget=timedelta(minutes=1),
        visibility=timedelta(minutes=2), poll_interval=timedelta(milliseconds=50),
        retry_contended=timedelta(milliseconds=200),
    )


async def hotel_full(shop: Shop) -> dict[str, bool]:
    print("\n1. the hotel is full: the saga compensates")
    trip = Trip(shop, hotel_full=True)
    w, flight = await new_trip(shop)
    await shop.durable.arrive(w, "trip", {"flight": flight, "amount": 300, "nights": 2})
    await worker(trip).run(until=lambda: w in trip.finished)
    print(f"  result: {trip.finished[w]}")
    seats = await shop.held(w, flight)
    return {
        "rolled back": trip.finished[w] == {"status": "rolled back",
                                           "reason": "hotel: no rooms left"},
        "refunded once": trip.refunds.performed == 1 and trip.gateway.performed == 1,
        "seat released": seats == 0,
    }


async def fenced_forward_pass(shop: Shop) -> dict[str, bool]:
    print("\n2. the forward pass is fenced: it compensates nothing")
    trip = Trip(shop, hotel_full=False)
    w, flight = await new_trip(shop)
    await shop.durable.arrive(w, "trip", {"flight": flight, "amount": 450, "nights": 3})
    trip.stall[w] = 4 * ALIVE.total_seconds()
    # The first pass is run by hand with no renewal tick, standing in for a stopped process.
    stalled = await shop.durable.checkpointer.claim(w, alive=ALIVE, budget=timedelta(minutes=1))
    first = asyncio.create_task(resume(shop.durable, stalled, trip.body))
    await worker(trip).run(until=lambda: w in trip.finished)  # contended until the claim lapses
    print(f"  result: {trip.finished[w]}")
    fenced: Fenced | None = None
    try:
        await first
    except Fenced as exc:
        fenced = exc
        print(f"  [{w} pass {stalled.token}] fenced: {exc}")
    seats = await shop.held(w, flight)
    return {
        "the stalled pass was fenced": fenced is not None,
        "booked by the newer pass": trip.finished[w] == {
            "status": "booked", "charge": "charge_1", "hotel": "hotel_1"},
        "charged once, refunded never": trip.gateway.performed == 1 and trip.refunds.performed == 0,
        "seat still held": seats == 1,
    }


async def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    async with open_shop(args) as shop:
        print(f"store: {shop.name}")
        checks = {**await hotel_full(shop), **await fenced_forward_pass(shop)}
    print()
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
