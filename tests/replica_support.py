"""Helpers for tests of several ``drawbridge serve`` replicas on one PostgreSQL database.

Each replica is a real serve process with its own directory (configuration, evidence, admin token)
and a ``recording`` upstream of its own that appends every line it receives to one shared log, so a
test counts how often a call reached an upstream across all replicas.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any, Final

import anyio
import httpx
from approval_support import wait_pending_on
from conftest import PYTHON, SERVERS, scaled
from serve_support import Running, http_client, write_config

REPLICA_APPROVAL_SECONDS: Final = 1.0
"""How soon a resolution on one replica must release the call waiting on another (the issue's bound)."""
PENDING_TIMEOUT: Final = scaled(30.0)
"""Seconds a test waits for an approval to appear pending (a loaded machine starts processes slowly)."""
CALL_TIMEOUT: Final = scaled(30.0)
RECOVERY_TIMEOUT: Final = scaled(60.0)
"""Seconds a replica may take to serve stateful calls again once PostgreSQL is back."""

POLICIES: Final = {
    "p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['rec.safe_read']\n    action: allow\n"
    "  - tools: ['rec.delete_all']\n    action: human_approval\n"
}
KEY_ENV: Final = {"DRAWBRIDGE_TEST_BIND_KEY": secrets.token_hex(32), "DRAWBRIDGE_TEST_STATE_KEY": secrets.token_hex(32)}
KEYS: Final = {
    "approval_binding": [{"id": "bind-1", "env": "DRAWBRIDGE_TEST_BIND_KEY"}],
    "request_state": [{"id": "state-1", "env": "DRAWBRIDGE_TEST_STATE_KEY"}],
}


def recording_upstream(log: Path) -> dict[str, Any]:
    return {
        "name": "rec", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "recording.py")],
        "env": {"RECORDING_LOG": str(log)},
    }


def replica_config(
    root: Path, name: str, url: str, log: Path, *, upstream: dict[str, Any] | None = None, **top: Any
) -> Path:
    """Replica ``name``'s configuration in ``root/name``, on the database at ``url`` (its upstream: the
    recording server writing to ``log``, unless another is given)."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "approval": {"timeout_seconds": 60},
        "evidence_dir": str(directory / "evidence"),
        "state_path": str(directory / "drawbridge.db"),
        "auth": {"anonymous_agent": "guest"},
        "state": url,
        "replica": {"id": name, "keys": KEYS},
    }
    options.update(top)
    upstreams = [upstream if upstream is not None else recording_upstream(log)]
    return write_config(directory, upstreams, policies=POLICIES, **options)


def upstream_calls(log: Path, tool: str) -> int:
    """How many ``tools/call`` of ``tool`` reached any replica's upstream."""
    if not log.exists():
        return 0
    count = 0
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("method") == "tools/call" and (message.get("params") or {}).get("name") == tool:
            count += 1
    return count


def approval_id_of(text: str) -> str:
    match = re.search(r"Approval required \(id: ([0-9a-f]{16})\)", text)
    assert match is not None, text
    return match.group(1)


async def approve_across(waiting: Running, operator: Running, arguments: dict[str, Any]) -> tuple[str, Any, float]:
    """A call waits for approval on ``waiting`` while ``operator``'s control plane approves it: the
    approval's id, the call's result, and the seconds from the approval to the call's release."""
    assert waiting.url is not None
    async with http_client(waiting.url) as client, httpx.AsyncClient(
        base_url=operator.control(), headers=operator.control_headers(), trust_env=False
    ) as http:
        results: list[Any] = []
        finished = anyio.Event()

        async def call() -> None:
            results.append(await client.call_tool("rec.delete_all", arguments))
            finished.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            pending = await wait_pending_on(http, PENDING_TIMEOUT)
            approved_at = time.monotonic()
            response = await http.post(f"/approvals/{pending[0]['id']}/approve", json={"resolved_by": "op"})
            assert response.status_code == 200, response.text
            with anyio.fail_after(CALL_TIMEOUT):
                await finished.wait()
            released_after = time.monotonic() - approved_at
    return str(pending[0]["id"]), results[0], released_after
