"""A body that is not deterministic: it picks a step key with ``random()`` outside any step.

    wd-chaos workflow examples/workflows/lucky.py:lucky

A pass resumed after a crash draws another coupon code, finds no record under its key, and mails
a second coupon. The check exits 1 naming the key. ``lucky_fixed`` draws the code inside a step,
so a resumed pass reads the recorded one back: that one exits 0.
"""

from __future__ import annotations

import random
from typing import Any

from without_durability import Run


async def lucky(run: Run[Any]) -> object:
    code = f"{random.getrandbits(32):08x}"  # outside any step: a resumed pass draws again

    async def mail() -> object:
        return f"mailed coupon {code}"

    return await run.step(f"coupon-{code}", mail, str)


async def lucky_fixed(run: Run[Any]) -> object:
    async def draw() -> object:
        return f"{random.getrandbits(32):08x}"  # inside a step: recorded once, read back after

    code = await run.step("draw", draw, str)

    async def mail() -> object:
        return f"mailed coupon {code}"

    return await run.step(f"coupon-{code}", mail, str)
