"""The ``jsonfile`` store's mutants: each removes one guarantee, and some check must say so
(``wd-chaos mutants --store jsonfile``)."""

from __future__ import annotations

from typing import Any

from without_durability import Pass, Recorded
from without_durability.rules import check_key
from without_durability.testing.mutants import Mutant, swap

from . import FileCheckpointer


class RecordWithoutFence(FileCheckpointer):
    """``record`` writes first-writer-wins but never asks whether a newer pass exists."""

    async def record(self, pass_: Pass, key: str, value: object) -> Recorded:
        check_key(pass_.workflow, key)
        encoded = self._encode(pass_.workflow, key, value)

        def job(doc: dict[str, Any]) -> tuple[Recorded, bool]:
            return self._put(doc, pass_.workflow, key, encoded), True

        return await self.file.step(job)


MUTANTS = [
    Mutant(
        "jsonfile-record-without-fence",
        "jsonfile",
        "fencing",
        "record skips the fence check, so a superseded pass still writes",
        ("test_superseded_record_is_fenced_and_writes_nothing", "chaos:lease-stall:fencing"),
        swap("checkpointer", RecordWithoutFence),
    )
]
