"""compose.yaml parses and offers what the harness reads from the environment."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "compose.yaml"


def test_compose_offers_postgres_redis_and_the_pinned_toxiproxy() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert set(services) == {"postgres", "redis", "toxiproxy"}, sorted(services)
    assert services["toxiproxy"]["image"].endswith(":2.12.0"), services["toxiproxy"]["image"]
    assert "127.0.0.1:5432:5432" in services["postgres"]["ports"]
    assert "127.0.0.1:6379:6379" in services["redis"]["ports"]
    assert "8474" in " ".join(services["toxiproxy"]["command"])
    text = COMPOSE.read_text()
    for variable in ("WD_POSTGRES_URL", "WD_REDIS_URL", "WD_TOXIPROXY_URL"):
        assert variable in text, f"compose.yaml should say how to export {variable}"
    assert "fsync=off" not in text and "synchronous_commit=off" not in text
