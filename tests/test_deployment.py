"""docs/deployment.md works as written: its replica configuration and its HAProxy configuration, run
with two real replicas on a real PostgreSQL and a real HAProxy, keep each 2025-11-25 session on the
replica that opened it while sessions spread over both, and a 2026-07-28 client needs no affinity.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from approval_support import text_of, trace
from conftest import MODERN, ROOT, scaled
from replica_support import CALL_TIMEOUT, KEY_ENV, POLICIES, recording_upstream
from ruamel.yaml import YAML
from serve_support import free_port, http_client, http_gateway, wait_for_port

pytestmark = pytest.mark.anyio

DOC: Final = ROOT / "docs" / "deployment.md"
PROXY_START_TIMEOUT: Final = scaled(20.0)


def _block(language: str, holding: str = "") -> str:
    """The first ``language`` code block of the document that holds ``holding``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    found = [block for block in blocks if holding in block]
    assert found, f"no {language} block in {DOC}"
    return str(found[0])


def _replica(tmp_path: Path, name: str, port: int, proxy: int) -> Path:
    """The documented gw-a configuration, made replica ``name`` of this test (ports, paths, upstream)."""
    document: dict[str, Any] = YAML(typ="safe").load(_block("yaml", "# drawbridge-gw-a.yaml"))
    directory = tmp_path / name
    (directory / "policies").mkdir(parents=True)
    (directory / "policies" / "p.yaml").write_text(POLICIES["p.yaml"], encoding="utf-8")
    document["upstreams"] = [recording_upstream(tmp_path / "calls.log")]
    document["policy_dir"] = str(directory / "policies")
    document["evidence_dir"] = str(directory / "evidence")
    document["listen"].update(port=port, allowed_hosts=[f"127.0.0.1:{proxy}"])
    document["control"]["port"] = free_port()
    document["replica"]["id"] = name
    document["checkpoints"]["origin"] = f"example.com/drawbridge/{name}"
    assert document["rate_limits"]["per_agent_tool"]["burst"] >= 1  # shared buckets: tests/test_rate_limits.py
    document["rate_limits"] = {"per_agent": {"rate": 1000, "burst": 1000}}  # this test's calls come in a burst
    config = directory / "drawbridge.yaml"
    config.write_text(json.dumps(document), encoding="utf-8")
    return config


@contextmanager
def _haproxy(tmp_path: Path, proxy: int, ports: dict[str, int]) -> Iterator[subprocess.Popen[bytes]]:
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    text = _block("haproxy").replace("127.0.0.1:8080", f"127.0.0.1:{proxy}")
    text = text.replace("127.0.0.1:8787", f"127.0.0.1:{ports['gw-a']}").replace("127.0.0.1:8797", f"127.0.0.1:{ports['gw-b']}")
    config = tmp_path / "haproxy.cfg"
    config.write_text(text, encoding="utf-8")
    process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(proxy, PROXY_START_TIMEOUT)
        yield process
    finally:
        process.terminate()
        process.wait(scaled(10))


async def test_two_replicas_behind_the_documented_proxy_keep_each_session_on_its_replica(
    tmp_path: Path, postgres_url: str
) -> None:
    proxy = free_port()
    ports = {"gw-a": free_port(), "gw-b": free_port()}
    env = {
        "DRAWBRIDGE_STATE_URL": postgres_url,
        "DRAWBRIDGE_BINDING_KEY": KEY_ENV["DRAWBRIDGE_TEST_BIND_KEY"],
        "DRAWBRIDGE_REQUEST_STATE_KEY": KEY_ENV["DRAWBRIDGE_TEST_STATE_KEY"],
        "DRAWBRIDGE_ADMIN_TOKEN": "admin-token-for-both-replicas",
    }
    configs = {name: _replica(tmp_path, name, port, proxy) for name, port in ports.items()}
    with http_gateway(configs["gw-a"], env=env), http_gateway(configs["gw-b"], env=env), _haproxy(tmp_path, proxy, ports):
        url = f"http://127.0.0.1:{proxy}/mcp"
        for session in range(4):  # round robin spreads the sessions; each sticks to its replica
            async with http_client(url) as client:
                with anyio.fail_after(CALL_TIMEOUT):
                    for _ in range(5):
                        assert text_of(await client.call_tool("rec.safe_read", {"session": session})) == "ran safe_read"
        async with http_client(url, MODERN) as modern:
            with anyio.fail_after(CALL_TIMEOUT):
                for _ in range(4):
                    assert text_of(await modern.call_tool("rec.safe_read", {})) == "ran safe_read"
    served = {name: len(trace(tmp_path / name / "evidence", "tool_decision")) for name in ports}
    assert sum(served.values()) == 24 and all(count >= 5 for count in served.values()), served
