"""A codec that does not round-trip is refused before anything is stored: ``verify_codec``, and
every store's constructor, which runs it over ``SAMPLE_VALUES``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from without_durability import (
    InvalidInput,
    JsonCodec,
    MemoryCheckpointer,
    SqliteCheckpointer,
    sqlite_connect,
    verify_codec,
)

pytestmark = pytest.mark.asyncio


class RoundsFloats(JsonCodec):
    """Loses the fraction of every float."""

    def encode(self, value: object) -> str:
        return json.dumps(value, sort_keys=True, default=str, allow_nan=False).replace(".5", "")


class BoolsAsInts(JsonCodec):
    """True comes back 1: equal under ``==``, but not the value recorded."""

    def decode(self, encoded: str) -> object:
        return json.loads(encoded.replace("true", "1").replace("false", "0"))


class Salted(JsonCodec):
    """A different encoding every call: record's race decision compares encodings."""

    _n = itertools.count()

    def encode(self, value: object) -> str:
        return json.dumps({"v": value, "salt": next(self._n)})

    def decode(self, encoded: str) -> object:
        return json.loads(encoded)["v"]


class CannotDecode(JsonCodec):
    def decode(self, encoded: str) -> object:
        raise KeyError("lost the schema")


class IntsOnly:
    """Carries ints and nothing else (refuses the rest): judged on ints only, and they round-trip."""

    renders_json = True

    def encode(self, value: object) -> str:
        if type(value) is not int:
            raise TypeError("ints only")
        return str(value)

    def decode(self, encoded: str) -> object:
        return int(encoded)


BROKEN: dict[str, tuple[Any, str]] = {
    "rounds floats": (RoundsFloats(), "does not round-trip 1.5"),
    "bools as ints": (BoolsAsInts(), "does not round-trip True"),
    "salted": (Salted(), "not deterministic"),
    "cannot decode": (CannotDecode(), "cannot decode its own encoding"),
}


async def test_the_default_codec_and_a_narrow_one_pass() -> None:
    verify_codec(JsonCodec())
    verify_codec(IntsOnly())
    verify_codec(JsonCodec(), [{"deep": [[[[1]]]]}, "x" * 1000])


@pytest.mark.parametrize("label", list(BROKEN))
async def test_verify_codec_names_the_value_that_breaks(label: str) -> None:
    codec, why = BROKEN[label]
    with pytest.raises(InvalidInput, match=why):
        verify_codec(codec)


def _memory(codec: Any, tmp_path: Path) -> Any:
    return MemoryCheckpointer(codec=codec)


async def _sqlite(codec: Any, tmp_path: Path) -> Any:
    conn = await sqlite_connect(tmp_path / "store.db")
    try:
        return SqliteCheckpointer(conn, codec=codec)
    finally:
        await conn.close()


def _postgres(codec: Any, tmp_path: Path) -> Any:
    pool_module = pytest.importorskip("psycopg_pool")
    from without_durability_postgres import PostgresCheckpointer

    # never opened: the codec is judged before anything talks to a server
    pool = pool_module.AsyncConnectionPool("postgresql://nowhere.invalid/x", open=False)
    return PostgresCheckpointer(pool, codec=codec)


def _redis(codec: Any, tmp_path: Path) -> Any:
    redis_asyncio = pytest.importorskip("redis.asyncio")
    from without_durability_redis import RedisCheckpointer

    return RedisCheckpointer(redis_asyncio.Redis.from_url("redis://nowhere.invalid:1/0"), codec=codec)


BUILDERS: dict[str, Callable[[Any, Path], Any]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
    "redis": _redis,
}


@pytest.mark.parametrize("store", list(BUILDERS))
@pytest.mark.parametrize("label", list(BROKEN))
async def test_every_store_refuses_a_broken_codec_when_built(store: str, label: str, tmp_path: Path) -> None:
    codec, why = BROKEN[label]
    with pytest.raises(InvalidInput, match=why):
        built = BUILDERS[store](codec, tmp_path)
        if hasattr(built, "__await__"):
            await built
    good = BUILDERS[store](JsonCodec(), tmp_path)
    if hasattr(good, "__await__"):
        await good
