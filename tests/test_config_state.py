"""The state, replica and rate_limits sections of serve's configuration, and the startup errors of a
replica whose database cannot be used: one line, exit 2, never a key or a password."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, child_env, scaled
from replica_support import KEY_ENV, KEYS, recording_upstream

from drawbridge.config import ConfigError, parse_config
from drawbridge.config_rates import Bucket

URL = "postgresql://drawbridge@127.0.0.1:5432/drawbridge"


def parse(tmp_path: Path, env: dict[str, str] | None = None, **top: Any) -> Any:
    (tmp_path / "policies").mkdir(exist_ok=True)
    document = {"upstreams": [recording_upstream(tmp_path / "log")], "policy_dir": "./policies", **top}
    return parse_config(json.dumps(document), str(tmp_path / "drawbridge.yaml"), env if env is not None else KEY_ENV)


def test_a_url_or_a_mapping_names_the_shared_state_and_the_rings_load_from_the_environment(tmp_path: Path) -> None:
    plain = parse(tmp_path, state=URL, replica={"id": "gw-1", "keys": KEYS}).shared_state
    assert (plain.url, plain.pool_size, plain.replica_id) == (URL, 10, "gw-1")
    assert plain.binding_keys[0].key_id == "bind-1"
    assert plain.binding_keys[0].key == bytes.fromhex(KEY_ENV["DRAWBRIDGE_TEST_BIND_KEY"])
    assert URL not in repr(plain) and KEY_ENV["DRAWBRIDGE_TEST_BIND_KEY"] not in repr(plain)
    env = {**KEY_ENV, "DB_URL": URL}
    mapped = parse(tmp_path, env, state={"url_env": "DB_URL", "pool_size": 3}, replica={"keys": KEYS}).shared_state
    assert (mapped.url, mapped.pool_size, mapped.replica_id) == (URL, 3, None)
    assert parse(tmp_path).shared_state is None


@pytest.mark.parametrize(
    ("top", "env", "fragment"),
    [
        ({"state": "./state.db"}, KEY_ENV, "state must be a postgresql:// URL"),
        ({"state": URL}, KEY_ENV, "needs a replica section with its keys"),
        ({"state": URL, "replica": {"id": "a"}}, KEY_ENV, "replica.keys is required"),
        ({"state": URL, "replica": {"keys": KEYS}}, {"DRAWBRIDGE_TEST_BIND_KEY": "ab" * 8}, "at least 32 bytes"),
        ({"state": {"url_env": "NOPE"}, "replica": {"keys": KEYS}}, KEY_ENV, "NOPE is missing or empty"),
        ({"state": {"url": URL, "pool_size": 0}, "replica": {"keys": KEYS}}, KEY_ENV, "pool_size must be between"),
        ({"state": URL, "replica": {"id": "a b", "keys": KEYS}}, KEY_ENV, "replica.id must match"),
        ({"replica": {"keys": KEYS}}, KEY_ENV, "replica needs state"),
        ({"rate_limits": {}}, KEY_ENV, "rate_limits names no bucket"),
        ({"rate_limits": {"per_agent": {"rate": 0}}}, KEY_ENV, "rate must be a positive number"),
        ({"rate_limits": {"per_agent": {"rate": 1, "burst": 0}}}, KEY_ENV, "burst must be at least 1"),
        ({"rate_limits": {"per_agent": {"rate": 1e-320, "burst": 1}}}, KEY_ENV, "longer than any finite time to refill"),
        ({"rate_limits": {"per_agent_tool": {"rate": 1e-300, "burst": 10**400}}}, KEY_ENV, "finite time to refill"),
    ],
)
def test_what_cannot_work_is_refused_with_the_reason(
    tmp_path: Path, top: dict[str, Any], env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment) as refused:
        parse(tmp_path, env, **top)
    assert "ab" * 8 not in str(refused.value)


def test_rate_limits_load_with_a_default_burst(tmp_path: Path) -> None:
    limits = parse(tmp_path, rate_limits={"per_agent": {"rate": 2.5}, "per_agent_tool": {"rate": 1, "burst": 4}}).rate_limits
    assert (limits.per_agent, limits.per_agent_tool) == (Bucket(2.5, 3), Bucket(1.0, 4))


def test_a_replica_whose_database_is_unreachable_stops_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text("name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n")
    config = tmp_path / "drawbridge.yaml"
    config.write_text(json.dumps({
        "upstreams": [recording_upstream(tmp_path / "log")], "policy_dir": "./policies",
        "evidence_dir": str(tmp_path / "evidence"), "state": "postgresql://drawbridge:hunter2@127.0.0.1:1/x",
        "replica": {"keys": KEYS},
    }))
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "serve", "--config", str(config), "--stdio"], input="", check=False,
        capture_output=True, text=True, env=child_env(KEY_ENV), timeout=scaled(60),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to the state database" in lines[0], result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
