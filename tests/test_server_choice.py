"""Where a Postgres or Redis server comes from: a URL variable when set, else testcontainers when a
Docker engine answers, else a private server from the installed binaries; and the reason, one line.

The machine's own probe decides the first tests (Docker may or may not answer here: each branch is
asserted as it is found); the rest inject a probe's result into ``choose``, the one function that
decides, so the Docker branch is tested where no engine runs. Nothing is mocked: the servers
provided are real.
"""

from __future__ import annotations

import pytest
import redis

from wd_chaos.control.toxiproxy_server import TOXIPROXY_SERVER
from without_durability.testing.servers import (
    INSTALL_HINT,
    Probe,
    ServerRecipe,
    ServerUnavailable,
    choose,
    probe,
    provide,
)
from without_durability_postgres.local_server import POSTGRES_SERVER
from without_durability_redis.local_server import REDIS_CLUSTER_SERVER, REDIS_SERVER

RECIPES = {"postgres": POSTGRES_SERVER, "redis": REDIS_SERVER}
CONTAINER_KINDS = tuple(RECIPES)
NO_CONTAINER = {"toxiproxy": TOXIPROXY_SERVER, "redis-cluster": REDIS_CLUSTER_SERVER}


def recipe(kind: str) -> ServerRecipe:
    return {**RECIPES, **NO_CONTAINER}[kind]

DOCKER_ANSWERS = Probe(url=None, docker=None, missing=())
NO_DOCKER = Probe(url=None, docker="no Docker engine answers (a reason)", missing=())


@pytest.mark.parametrize("kind", CONTAINER_KINDS)
def test_this_machine_s_probe_picks_a_source_and_says_why(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv({"postgres": "WD_POSTGRES_URL", "redis": "WD_REDIS_URL"}[kind], raising=False)
    found = probe(recipe(kind))
    choice = choose(recipe(kind), found)
    if found.docker is None:
        assert choice.source == "testcontainers", choice
    else:
        # no engine here (or testcontainers missing): the fallback is taken and the reason given
        assert choice.source == "local", choice
        assert f"not testcontainers: {found.docker}" in choice.why, choice.why
        assert "testcontainers is not installed" in found.docker or "Docker" in found.docker, found.docker


def test_without_docker_provide_starts_a_private_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WD_REDIS_URL", raising=False)
    if probe(recipe("redis")).docker is None:
        pytest.skip("a Docker engine answers here: the container branch is taken (see the next tests)")
    with provide(recipe("redis")) as server:
        assert server.source == "local" and server.pid is not None
        assert redis.Redis.from_url(server.url).ping()


def test_a_url_variable_wins_over_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WD_REDIS_URL", raising=False)
    with provide(recipe("redis")) as private:
        monkeypatch.setenv("WD_REDIS_URL", private.url)
        found = probe(recipe("redis"))
        assert found.url == private.url and found.docker == "not probed"
        with provide(recipe("redis")) as server:
            assert (server.source, server.url) == ("env", private.url)
            assert redis.Redis.from_url(server.url).ping()
    assert choose(recipe("redis"), Probe(url="redis://x:1/0", docker=None, missing=("redis-server",))).source == "env"


@pytest.mark.parametrize("kind", CONTAINER_KINDS)
def test_docker_answering_picks_testcontainers_even_with_binaries_installed(kind: str) -> None:
    choice = choose(recipe(kind), DOCKER_ANSWERS)
    assert choice.source == "testcontainers", choice
    assert "Docker answers" in choice.why
    assert choose(recipe(kind), Probe(url=None, docker=None, missing=("initdb",))).source == "testcontainers"


@pytest.mark.parametrize("kind", CONTAINER_KINDS)
def test_a_server_to_restart_is_never_a_container(kind: str) -> None:
    choice = choose(recipe(kind), DOCKER_ANSWERS, private=True)
    assert choice.source == "local", choice
    assert "restart" in choice.why


@pytest.mark.parametrize("kind", ["toxiproxy", "redis-cluster"])
def test_only_postgres_and_redis_come_from_containers(kind: str) -> None:
    choice = choose(recipe(kind), DOCKER_ANSWERS)
    assert choice.source == "local", choice
    assert "has no container recipe" in choice.why


def test_no_source_at_all_says_what_to_do() -> None:
    choice = choose(recipe("postgres"), Probe(url=None, docker=NO_DOCKER.docker, missing=("initdb", "postgres")))
    assert choice.source is None
    assert "initdb, postgres not on PATH" in choice.why
    assert "no Docker engine answers" in choice.why
    assert INSTALL_HINT in choice.why and "WD_POSTGRES_URL" in choice.why


def test_provide_raises_the_reason_when_nothing_can_be_had(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WD_TOXIPROXY_URL", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # a real probe of a machine without the binary
    with pytest.raises(ServerUnavailable, match=r"toxiproxy-server not on PATH.*install-servers"), provide(recipe("toxiproxy")):
        pass
