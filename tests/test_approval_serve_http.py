"""``drawbridge serve`` over streamable HTTP: the same approval path as ``wrap``, in both eras.

A real gateway process with a GitHub-like upstream; mcp SDK clients over HTTP; the control plane the
gateway mounts beside ``/mcp``. Grants and operator approvals reach calls made over MCP.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import httpx
import pytest
from approval_support import Person, listed, text_of, trace, wait_pending_on
from conftest import MODERN, PYTHON, child_env, scaled
from serve_support import GITHUB, http_client, http_gateway, write_config

pytestmark = pytest.mark.anyio

POLICIES = {
    "p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['github.list_repos']\n    action: allow\n"
    "  - tools: ['github.delete_repo', 'github.add_deploy_key']\n    action: human_approval\n"
}
DELETE = {"owner": "acme", "name": "rocket"}


def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path, [GITHUB], policies=POLICIES, approval={"timeout_seconds": 10},
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"},
    )


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_in_band_approval_over_http_in_both_eras(tmp_path: Path, mode: str) -> None:
    person = Person()
    with http_gateway(config(tmp_path)) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url, mode, elicitation_callback=person) as client:
            done = await client.call_tool("github.delete_repo", DELETE)
            assert not done.is_error and text_of(done) == "deleted acme/rocket"
            assert listed(await client.call_tool("github.list_repos", {"owner": "acme"})) == ["anvil"]
    assert len(person.questions) == 1
    (resolved,) = [e["body"] for e in trace(tmp_path / "evidence", "approval_resolved")]
    assert (resolved["agent"], resolved["channel"], resolved["strength"]) == ("guest", "elicitation", "client")


async def test_operator_approval_and_a_grant_reach_calls_made_over_mcp(tmp_path: Path) -> None:
    with http_gateway(config(tmp_path)) as gateway:
        assert gateway.url is not None
        base, operator = gateway.control(), gateway.control_headers()
        async with http_client(gateway.url) as client, httpx.AsyncClient(
            base_url=base, trust_env=False, headers=operator
        ) as http:
            results: list[object] = []

            async def call() -> None:
                results.append(await client.call_tool("github.delete_repo", DELETE))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                pending = await wait_pending_on(http)
                approve = await http.post(f"/approvals/{pending[0]['id']}/approve", json={"resolved_by": "op-hal"})
                assert approve.status_code == 200
            assert text_of(results[0]) == "deleted acme/rocket"  # type: ignore[arg-type]

            grant = await http.post("/grants", json={"agent": "guest", "tools": "github.add_*", "duration": "1m"})
            assert grant.status_code == 201
            key = {"owner": "acme", "repo": "anvil", "title": "k", "key": "ssh-ed25519 C"}
            with anyio.fail_after(scaled(5)):
                lifted = await client.call_tool("github.add_deploy_key", key)
            assert not lifted.is_error and "added" in text_of(lifted)
    kinds = [e["kind"] for e in trace(tmp_path / "evidence") if e["kind"].startswith(("approval_", "grant_"))]
    assert kinds == ["approval_requested", "approval_resolved", "grant_created", "approval_by_grant"]


async def test_an_approval_its_retry_never_used_is_expired_by_a_restart_not_left_approved(tmp_path: Path) -> None:
    """The argument binding key is drawn per process: an approval the retry did not pick up before a
    restart can never be picked up after it, so it must not go on reading ``approved``."""
    settings = write_config(
        tmp_path, [GITHUB], policies=POLICIES, approval={"timeout_seconds": 60, "non_blocking": True},
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"},
    )
    used_call = {"owner": "acme", "name": "anvil"}
    with http_gateway(settings) as gateway:
        assert gateway.url is not None
        async with http_client(gateway.url) as client, httpx.AsyncClient(
            base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()
        ) as http:
            ids = {}
            for call in (DELETE, used_call):
                asked = await client.call_tool("github.delete_repo", call)
                assert asked.is_error
                (pending,) = await wait_pending_on(http)
                approved = await http.post(f"/approvals/{pending['id']}/approve", json={"resolved_by": "op-hal"})
                assert approved.status_code == 200
                ids[call["name"]] = pending["id"]
            ran = await client.call_tool("github.delete_repo", used_call)  # the retry uses its approval
            assert not ran.is_error and text_of(ran) == "deleted acme/anvil"
    with http_gateway(settings) as gateway:
        assert gateway.url is not None
        base, operator = gateway.control(), gateway.control_headers()
        async with httpx.AsyncClient(base_url=base, trust_env=False, headers=operator) as http:
            unused = (await http.get(f"/approvals/{ids['rocket']}")).json()
            assert (unused["status"], unused["resolved_by"], unused["channel"]) == ("expired", "system:restart", "system")
            assert "approved by op-hal through control_plane" in unused["resolution_reason"]
            assert "no retry can use it any more" in unused["resolution_reason"]
            kept = (await http.get(f"/approvals/{ids['anvil']}")).json()
            assert (kept["status"], kept["resolved_by"]) == ("approved", "op-hal")  # used: history as it was
        assert gateway.token_file is not None
        shown = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [PYTHON, "-m", "drawbridge", "approvals", "show", ids["rocket"], "--url", base,
             "--token-file", str(gateway.token_file)],
            capture_output=True, text=True, timeout=scaled(60), env=child_env(),
        ))
        assert shown.returncode == 0, shown.stderr
        assert "expired" in shown.stdout and "system:restart" in shown.stdout and "approved by op-hal" in shown.stdout
        async with http_client(gateway.url) as client:
            again = await client.call_tool("github.delete_repo", DELETE)
            assert again.is_error and "Approval required" in text_of(again)  # asked anew, not run
    ended = [e["body"] for e in trace(tmp_path / "evidence", "approval_resolved") if e["body"]["approval_id"] == ids["rocket"]]
    assert [(e["status"], e["resolved_by"]) for e in ended] == [("approved", "op-hal"), ("expired", "system:restart")]
