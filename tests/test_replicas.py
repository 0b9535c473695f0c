"""Two ``drawbridge serve`` replicas on one real PostgreSQL: approvals, single use and keys are shared.

Each replica is a real process with its own upstream child; the upstreams write every call they
receive to one log, so "runs once" is counted where it happens. Clients are the mcp SDK's.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from approval_support import cli, text_of, trace, wait_pending_on
from conftest import MODERN, PYTHON, SERVERS, eventually_async, scaled
from mcp.shared.exceptions import MCPError
from postgres_support import Cluster
from replica_support import (
    CALL_TIMEOUT,
    KEY_ENV,
    PENDING_TIMEOUT,
    RECOVERY_TIMEOUT,
    REPLICA_APPROVAL_SECONDS,
    approval_id_of,
    approve_across,
    replica_config,
    upstream_calls,
)
from serve_support import background, http_client, http_gateway, serve_argv

from drawbridge.evidence.chain import verify_chain
from drawbridge.gateway.pipeline.pins import RETRY_MAX_SECONDS
from drawbridge.state.postgres import DEFAULT_TIMEOUT

pytestmark = pytest.mark.anyio

OUTAGE_SECONDS = 17.0
"""How long the long outage lasts, from the pool's first failed attempt."""
READY_AGAIN_SECONDS = scaled(RETRY_MAX_SECONDS + DEFAULT_TIMEOUT + 1.0)
"""The bound on readiness after the database is back: one pin check retry interval, one checkout."""


async def test_an_approval_given_on_one_replica_releases_the_call_waiting_on_the_other_once(
    tmp_path: Path, postgres_url: str
) -> None:
    log = tmp_path / "calls.log"
    config_a = replica_config(tmp_path, "a", postgres_url, log)
    config_b = replica_config(tmp_path, "b", postgres_url, log)
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        approval_id, result, released_after = await approve_across(b, a, {"scope": "all"})
        assert text_of(result) == "ran delete_all"
        assert released_after < REPLICA_APPROVAL_SECONDS, released_after
        # The other channels see it resolved: B's control plane reads the same queue.
        async with httpx.AsyncClient(base_url=b.control(), headers=b.control_headers(), trust_env=False) as op_b:
            shown = (await op_b.get(f"/approvals/{approval_id}")).json()
            assert shown["status"] == "approved" and shown["resolved_by"] == "op"
            again = await op_b.post(f"/approvals/{approval_id}/deny", json={"resolved_by": "op-b"})
            assert again.status_code == 409, again.text
    assert upstream_calls(log, "delete_all") == 1
    # Evidence stays per replica: every entry of each chain names its replica, under an origin of its own.
    (start_a,), (start_b,) = (trace(tmp_path / r / "evidence", "run_start") for r in ("a", "b"))
    assert (start_a["body"]["replica"], start_b["body"]["replica"]) == ("a", "b")
    kinds = {"a": {"run_start", "approval_resolved"}, "b": {"run_start", "approval_requested", "tool_decision"}}
    for replica in ("a", "b"):
        entries = trace(tmp_path / replica / "evidence")
        assert kinds[replica] <= {entry["kind"] for entry in entries}
        assert {entry["body"].get("replica") for entry in entries} == {replica}, entries
    assert start_a["body"]["origin"] != start_b["body"]["origin"]
    (waited,) = trace(tmp_path / "b" / "evidence", "approval_requested")
    (resolved,) = trace(tmp_path / "b" / "evidence", "approval_resolved")
    assert resolved["body"]["approval_id"] == waited["body"]["approval_id"] == approval_id
    assert resolved["body"]["resolved_by"] == "op"


def _reaching(replica: Any) -> list[str]:
    """The CLI's options reaching ``replica``'s control plane."""
    return ["--url", replica.control(), "--token-file", str(replica.token_file)]


async def test_approvals_show_on_another_replica_names_the_replica_that_holds_the_call(
    tmp_path: Path, postgres_url: str
) -> None:
    config_a, config_b = (replica_config(tmp_path, name, postgres_url, tmp_path / "calls.log") for name in "ab")
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        assert a.url is not None
        async with http_client(a.url) as client, httpx.AsyncClient(
            base_url=b.control(), headers=b.control_headers(), trust_env=False
        ) as op_b:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "rec.delete_all", {"scope": "every row"})
                (pending,) = await wait_pending_on(op_b, PENDING_TIMEOUT)
                assert pending["replica"] == "a"

                def show(on: Any) -> str:
                    done = cli("approvals", "show", pending["id"], *_reaching(on))
                    assert done.returncode == 0, done.stderr
                    return done.stdout

                on_b = await anyio.to_thread.run_sync(show, b)
                assert "held by gateway 'a', which asked for this approval, not by gateway 'b'" in on_b, on_b
                assert "same state file" not in on_b and "every row" not in on_b
                on_a = await anyio.to_thread.run_sync(show, a)
                assert "every row" in on_a and "held by gateway" not in on_a, on_a
                listed = cli("approvals", "list", "--format", "json", *_reaching(b))
                assert [item["replica"] for item in json.loads(listed.stdout)] == ["a"], listed.stdout
                denied = await op_b.post(f"/approvals/{pending['id']}/deny", json={"resolved_by": "op-b"})
                assert denied.status_code == 200, denied.text


async def test_a_non_blocking_retry_on_the_other_replica_runs_once(tmp_path: Path, postgres_url: str) -> None:
    log = tmp_path / "calls.log"
    approval = {"timeout_seconds": 60, "non_blocking": True}
    config_a = replica_config(tmp_path, "a", postgres_url, log, approval=approval)
    config_b = replica_config(tmp_path, "b", postgres_url, log, approval=approval)
    arguments = {"scope": "tmp"}
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        assert a.url is not None and b.url is not None
        async with http_client(a.url) as on_a, http_client(b.url) as on_b, httpx.AsyncClient(
            base_url=b.control(), headers=b.control_headers(), trust_env=False
        ) as operator_b:
            with anyio.fail_after(CALL_TIMEOUT):
                first = await on_a.call_tool("rec.delete_all", arguments)
            approval_id = approval_id_of(text_of(first))
            response = await operator_b.post(f"/approvals/{approval_id}/approve", json={"resolved_by": "op-b"})
            assert response.status_code == 200, response.text
            with anyio.fail_after(CALL_TIMEOUT):
                retried = await on_b.call_tool("rec.delete_all", arguments)
                assert text_of(retried) == "ran delete_all"
                # The approval is used up: the same retry on either replica asks again.
                for client in (on_a, on_b):
                    again = await client.call_tool("rec.delete_all", arguments)
                    assert again.is_error and approval_id_of(text_of(again)) != approval_id
    assert upstream_calls(log, "delete_all") == 1


async def test_a_replica_killed_mid_approval_leaves_the_approval_to_the_other(
    tmp_path: Path, postgres_url: str
) -> None:
    log = tmp_path / "calls.log"
    config_a = replica_config(tmp_path, "a", postgres_url, log)
    config_b = replica_config(tmp_path, "b", postgres_url, log)
    arguments = {"scope": "logs"}
    with http_gateway(config_b, env=KEY_ENV) as b:
        assert b.url is not None
        async with httpx.AsyncClient(base_url=b.control(), headers=b.control_headers(), trust_env=False) as op_b:
            with http_gateway(config_a, env=KEY_ENV) as a:
                assert a.url is not None
                async with anyio.create_task_group() as tg:

                    async def doomed_call() -> None:
                        async with http_client(a.url) as on_a:  # type: ignore[arg-type]
                            await on_a.call_tool("rec.delete_all", arguments)

                    tg.start_soon(doomed_call)
                    pending = await wait_pending_on(op_b, PENDING_TIMEOUT)
                    a.process.kill()  # mid-approval: the call waiting on A dies with it
                    a.process.wait()
                    tg.cancel_scope.cancel()
            response = await op_b.post(f"/approvals/{pending[0]['id']}/approve", json={"resolved_by": "op-b"})
            assert response.status_code == 200, response.text
            async with http_client(b.url) as on_b:
                with anyio.fail_after(CALL_TIMEOUT):
                    retried = await on_b.call_tool("rec.delete_all", arguments)
                assert text_of(retried) == "ran delete_all"
                # Used once: the same call again waits for a new approval, which the operator denies.
                async with anyio.create_task_group() as tg:
                    tg.start_soon(on_b.call_tool, "rec.delete_all", arguments)
                    fresh = await wait_pending_on(op_b, PENDING_TIMEOUT)
                    assert fresh[0]["id"] != pending[0]["id"]
                    denied = await op_b.post(f"/approvals/{fresh[0]['id']}/deny", json={"resolved_by": "op-b"})
                    assert denied.status_code == 200, denied.text
    assert upstream_calls(log, "delete_all") == 1


def test_a_replica_with_other_keys_does_not_start_on_a_database_others_use(
    tmp_path: Path, postgres_url: str
) -> None:
    log = tmp_path / "calls.log"
    with http_gateway(replica_config(tmp_path, "a", postgres_url, log), env=KEY_ENV):
        pass
    other_keys = {**KEY_ENV, "DRAWBRIDGE_TEST_BIND_KEY": "ab" * 32}
    with pytest.raises(AssertionError, match="approval_binding key 'bind-1' differs") as failed:
        with http_gateway(replica_config(tmp_path, "b", postgres_url, log), env=other_keys):
            pass
    assert "ab" * 32 not in str(failed.value)


def _verify_chain(evidence: Path) -> None:
    with open(evidence / "trace.ndjson", "rb") as trace:
        report = verify_chain(trace)
    assert report.ok, report


async def test_postgresql_restarted_under_load_refuses_then_recovers_and_the_chains_verify(
    tmp_path: Path, postgres_cluster: Cluster, postgres_url: str
) -> None:
    log = tmp_path / "calls.log"
    approval = {"timeout_seconds": 60, "non_blocking": True}
    config_a = replica_config(tmp_path, "a", postgres_url, log, approval=approval)
    config_b = replica_config(tmp_path, "b", postgres_url, log, approval=approval)
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        assert a.url is not None and b.url is not None
        async with http_client(a.url) as on_a, http_client(b.url) as on_b:
            reads_failed: list[str] = []
            reads = 0
            stop = anyio.Event()

            async def load(client: Any) -> None:
                nonlocal reads
                while not stop.is_set():  # calls that need no state keep running whatever the database does
                    result = await client.call_tool("rec.safe_read", {})
                    reads += 1
                    if result.is_error:
                        reads_failed.append(text_of(result))

            async with anyio.create_task_group() as tg:
                tg.start_soon(load, on_a)
                tg.start_soon(load, on_b)
                for client in (on_a, on_b):
                    with anyio.fail_after(CALL_TIMEOUT):
                        asked = await client.call_tool("rec.delete_all", {"before": True})
                    assert "Approval required" in text_of(asked)
                await anyio.to_thread.run_sync(postgres_cluster.stop)
                for client in (on_a, on_b):
                    with anyio.fail_after(CALL_TIMEOUT):
                        refused = await client.call_tool("rec.delete_all", {"during": True})
                    assert refused.is_error and "state unavailable" in text_of(refused), text_of(refused)
                await anyio.to_thread.run_sync(postgres_cluster.start)
                approval_ids = []
                for client in (on_a, on_b):

                    async def asked_again(client: Any = client) -> str | None:
                        again = text_of(await client.call_tool("rec.delete_all", {"after": True}))
                        assert "Approval required" in again or "state unavailable" in again, again
                        return again if "Approval required" in again else None

                    again = await eventually_async(asked_again, RECOVERY_TIMEOUT, "the state being available again")
                    approval_ids.append(approval_id_of(again))
                assert approval_ids[0] == approval_ids[1]  # the same question, asked once, shared
                stop.set()
            assert reads > 0 and reads_failed == []
        async with httpx.AsyncClient(base_url=a.control(), headers=a.control_headers(), trust_env=False) as op_a:
            response = await op_a.post(f"/approvals/{approval_ids[0]}/approve", json={"resolved_by": "op-a"})
            assert response.status_code == 200, response.text
        async with http_client(b.url) as on_b:
            with anyio.fail_after(CALL_TIMEOUT):
                ran = await on_b.call_tool("rec.delete_all", {"after": True})
            assert text_of(ran) == "ran delete_all"
        for directory in ("a", "b"):
            _verify_chain(tmp_path / directory / "evidence")
    assert upstream_calls(log, "delete_all") == 1


def _rugpull(root: Path, name: str, extra: list[str], state_name: str = "rugpull.json") -> dict[str, Any]:
    """The rug-pull server; its catalogue (shared by every replica's child unless ``state_name`` is
    the replica's own) is read at each start."""
    state = root / state_name
    state.write_text(json.dumps({"description": "Echo the text back.", "extra": extra}), encoding="utf-8")
    return {
        "name": "rugpull", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "rugpull.py")],
        "env": {"RUGPULL_STATE": str(state), "RUGPULL_PID": str(root / f"rugpull-{name}.pid")},
    }


async def _until_ok(client: Any, tool: str, deadline: float, arguments: dict[str, Any] | None = None) -> Any:
    async def ran() -> Any:
        result = await client.call_tool(tool, arguments or {})
        return None if result.is_error else result

    return await eventually_async(ran, deadline, f"{tool} running")


async def test_a_pin_accepted_on_one_replica_holds_on_the_other(tmp_path: Path, postgres_url: str) -> None:
    allow = {"p.yaml": "name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"}
    configs = {
        name: replica_config(tmp_path, name, postgres_url, tmp_path / "log", upstream=_rugpull(tmp_path, name, []),
                             pin_tools=True)
        for name in ("a", "b")
    }
    for name in ("a", "b"):
        for policy in (tmp_path / name / "policies").iterdir():
            policy.unlink()
        (tmp_path / name / "policies" / "p.yaml").write_text(allow["p.yaml"], encoding="utf-8")
    with http_gateway(configs["a"], env=KEY_ENV) as a, http_gateway(configs["b"], env=KEY_ENV) as b:
        assert a.url is not None and b.url is not None
        (tmp_path / "rugpull.json").write_text(
            json.dumps({"description": "Echo the text back.", "extra": ["exfiltrate"]}), encoding="utf-8"
        )
        for name in ("a", "b"):  # each replica's child restarts with the new catalogue
            os.kill(int((tmp_path / f"rugpull-{name}.pid").read_text()), signal.SIGKILL)
        async with http_client(b.url) as on_b, httpx.AsyncClient(
            base_url=a.control(), headers=a.control_headers(), trust_env=False
        ) as operator_a:
            # B sees the new tool, held back by its pin floor (an MCPError: not in B's catalogue yet, its
            # child is restarting).
            held = await eventually_async(lambda: on_b.call_tool("rugpull.exfiltrate", {}), PENDING_TIMEOUT,
                                          "the new tool on B", ignoring=(MCPError,))
            assert held.is_error and "exfiltrate" in text_of(held)
            async def listed_on_a() -> bool:  # A's catalogue has it too before it is accepted
                return "rugpull.exfiltrate" in {t["name"] for t in (await operator_a.get("/tools")).json()}

            await eventually_async(listed_on_a, PENDING_TIMEOUT, "the new tool in A's catalogue")
            accepted = await operator_a.post("/tools/pins/accept", json={"server": "rugpull", "by": "op-a"})
            assert accepted.status_code == 200 and accepted.json()["count"] == 1, accepted.text
            accepted_at = time.monotonic()
            ran = await _until_ok(on_b, "rugpull.exfiltrate", CALL_TIMEOUT)
            applied_after = time.monotonic() - accepted_at
    assert text_of(ran) == "exfiltrate"
    assert applied_after < REPLICA_APPROVAL_SECONDS, applied_after


async def test_a_replica_shows_and_accepts_what_its_own_server_offers_not_anothers(
    tmp_path: Path, postgres_url: str
) -> None:
    """Each replica's child offers its own changed ``echo``; B checked last, so the shared observation
    is B's. A's control plane still shows A's server's definition, and an accept through A of B's
    fingerprint is refused (409) rather than pinning what A's own server does not offer."""
    allow = "name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"
    configs = {}
    for name in ("a", "b"):
        upstream = _rugpull(tmp_path, name, [], state_name=f"rugpull-{name}.json")
        configs[name] = replica_config(tmp_path, name, postgres_url, tmp_path / "log", upstream=upstream,
                                       pin_tools=True)
        for policy in (tmp_path / name / "policies").iterdir():
            policy.unlink()
        (tmp_path / name / "policies" / "p.yaml").write_text(allow, encoding="utf-8")
    with http_gateway(configs["a"], env=KEY_ENV) as a, http_gateway(configs["b"], env=KEY_ENV) as b:
        assert a.url is not None and b.url is not None
        async with http_client(a.url) as on_a, http_client(b.url) as on_b, httpx.AsyncClient(
            base_url=a.control(), headers=a.control_headers(), trust_env=False
        ) as operator_a, httpx.AsyncClient(
            base_url=b.control(), headers=b.control_headers(), trust_env=False
        ) as operator_b:
            for client in (on_a, on_b):
                await _until_ok(client, "rugpull.echo", CALL_TIMEOUT, {"text": "x"})
            for name, operator in (("a", operator_a), ("b", operator_b)):  # B's check comes last
                (tmp_path / f"rugpull-{name}.json").write_text(
                    json.dumps({"description": f"Echo, the {name} way.", "extra": []}), encoding="utf-8"
                )
                os.kill(int((tmp_path / f"rugpull-{name}.pid").read_text()), signal.SIGKILL)

                async def checked(operator: httpx.AsyncClient = operator) -> bool:  # and observed
                    tools = (await operator.get("/tools")).json()
                    return any(t["name"] == "rugpull.echo" and t["pin_status"] == "changed" for t in tools)

                await eventually_async(checked, PENDING_TIMEOUT, f"echo's change checked on {name}")

            async def current(operator: httpx.AsyncClient) -> dict[str, Any]:
                (tool,) = (await operator.get("/tools/pins")).json()
                return dict(tool["current"])

            on_a_shown, on_b_shown = await current(operator_a), await current(operator_b)
            assert on_a_shown["description"] == "Echo, the a way.", on_a_shown
            assert on_b_shown["description"] == "Echo, the b way.", on_b_shown
            wrong = await operator_a.post("/tools/pins/accept", json={
                "server": "rugpull", "by": "op", "fingerprints": {"rugpull.echo": on_b_shown["fingerprint"]},
            })
            assert wrong.status_code == 409 and "nothing was accepted" in wrong.text, wrong.text
            assert (await current(operator_a))["fingerprint"] == on_a_shown["fingerprint"]
            right = await operator_a.post("/tools/pins/accept", json={
                "server": "rugpull", "by": "op", "fingerprints": {"rugpull.echo": on_a_shown["fingerprint"]},
            })
            assert right.status_code == 200 and right.json()["count"] == 1, right.text
            ran = await _until_ok(on_a, "rugpull.echo", CALL_TIMEOUT, {"text": "x"})
            assert text_of(ran) == "x"


MODERN_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}
APPROVE_IN_BAND = {"drawbridge_approval": {"action": "accept", "content": {"decision": "approve"}}}


async def _modern_call(url: str, request_id: int, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One stateless 2026-07-28 tools/call over HTTP, as raw JSON-RPC (the retry goes where the test says)."""
    params = {"name": "rec.delete_all", "arguments": arguments, "_meta": MODERN_ENVELOPE, **extra}
    headers = {
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call", "Mcp-Name": "rec.delete_all",
    }
    async with httpx.AsyncClient(trust_env=False, timeout=CALL_TIMEOUT) as http:
        response = await http.post(
            url, json={"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}, headers=headers
        )
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and '"id"' in line)
    answer = json.loads(text)
    assert "result" in answer, answer
    return dict(answer["result"])


async def test_a_request_state_retry_runs_once_on_whichever_replica_it_lands(tmp_path: Path, postgres_url: str) -> None:
    log = tmp_path / "calls.log"
    config_a = replica_config(tmp_path, "a", postgres_url, log)
    config_b = replica_config(tmp_path, "b", postgres_url, log)
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        assert a.url is not None and b.url is not None
        asked = await _modern_call(a.url, 1, {"scope": "x"})
        assert asked["resultType"] == "input_required", asked
        state = asked["requestState"]
        ran = await _modern_call(b.url, 2, {"scope": "x"}, requestState=state, inputResponses=APPROVE_IN_BAND)
        assert not ran.get("isError") and ran["content"][0]["text"] == "ran delete_all", ran
        for url in (a.url, b.url):
            replayed = await _modern_call(url, 3, {"scope": "x"}, requestState=state, inputResponses=APPROVE_IN_BAND)
            assert replayed["isError"] and "already used" in replayed["content"][0]["text"], replayed
    assert upstream_calls(log, "delete_all") == 1


async def test_after_postgresql_restarts_an_approval_on_one_replica_still_releases_the_other(
    tmp_path: Path, postgres_cluster: Cluster, postgres_url: str
) -> None:
    log = tmp_path / "calls.log"
    config_a = replica_config(tmp_path, "a", postgres_url, log)
    config_b = replica_config(tmp_path, "b", postgres_url, log)
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        await anyio.to_thread.run_sync(postgres_cluster.stop)
        await anyio.to_thread.run_sync(postgres_cluster.start)
        await eventually_async(  # each replica listens again, and says so
            lambda: all("state notifications resumed" in r.text() for r in (a, b)), RECOVERY_TIMEOUT,
            "both replicas listening again",
        )
        _, result, released_after = await approve_across(b, a, {"scope": "after restart"})
    assert text_of(result) == "ran delete_all"
    assert released_after < REPLICA_APPROVAL_SECONDS, released_after
    assert upstream_calls(log, "delete_all") == 1


async def test_a_grant_made_on_one_replica_lifts_the_approval_on_the_other(tmp_path: Path, postgres_url: str) -> None:
    log = tmp_path / "calls.log"
    config_a = replica_config(tmp_path, "a", postgres_url, log)
    config_b = replica_config(tmp_path, "b", postgres_url, log)
    with http_gateway(config_a, env=KEY_ENV) as a, http_gateway(config_b, env=KEY_ENV) as b:
        assert b.url is not None
        async with httpx.AsyncClient(base_url=a.control(), headers=a.control_headers(), trust_env=False) as op_a:
            made = await op_a.post("/grants", json={"agent": "guest", "tools": "rec.delete_*", "duration": "1m"})
            assert made.status_code == 201, made.text
        async with http_client(b.url) as on_b:
            with anyio.fail_after(CALL_TIMEOUT):
                lifted = await on_b.call_tool("rec.delete_all", {"scope": "granted"})
    assert text_of(lifted) == "ran delete_all"
    kinds = [e["kind"] for e in trace(tmp_path / "b" / "evidence") if e["kind"].startswith(("approval_", "grant_"))]
    assert kinds == ["approval_by_grant"]  # B asked nobody; the grant's creation is in A's chain
    assert [e["kind"] for e in trace(tmp_path / "a" / "evidence", "grant_created")] == ["grant_created"]


def _pinning_replica(tmp_path: Path, url: str) -> Path:
    """Replica ``a`` guarding the rug-pull server's pins, every tool allowed by policy."""
    allow = "name: p\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"
    config = replica_config(tmp_path, "a", url, tmp_path / "log", upstream=_rugpull(tmp_path, "a", []), pin_tools=True)
    for policy in (tmp_path / "a" / "policies").iterdir():
        policy.unlink()
    (tmp_path / "a" / "policies" / "p.yaml").write_text(allow, encoding="utf-8")
    return config


def _readyz(url: str) -> str:
    return url.rsplit("/mcp", 1)[0] + "/readyz"


async def _stop_under_a_recheck(client: Any, cluster: Cluster, root: Path) -> None:
    """Once replica a serves the rug-pull server, stop PostgreSQL and end the server's child, so that
    its catalogue is checked again while the pins cannot be read."""
    await _until_ok(client, "rugpull.echo", CALL_TIMEOUT, {"text": "x"})
    await anyio.to_thread.run_sync(cluster.stop)
    os.kill(int((root / "rugpull-a.pid").read_text()), signal.SIGKILL)


async def test_after_a_long_outage_readiness_returns_within_the_pin_checks_bound(
    tmp_path: Path, postgres_cluster: Cluster, postgres_url: str
) -> None:
    """The database down long enough for the driver pool's own reconnection backoff to grow past 16 s:
    once it is back, /readyz is 200 again within the documented bound (the pin check's retry, at most
    RETRY_MAX_SECONDS apart, then one checkout), not when the pool's backoff next tries."""
    config = _pinning_replica(tmp_path, postgres_url)
    with http_gateway(config, env=KEY_ENV) as a:
        assert a.url is not None
        readyz = _readyz(a.url)
        async with http_client(a.url) as client, httpx.AsyncClient(trust_env=False) as http:
            await _stop_under_a_recheck(client, postgres_cluster, tmp_path)

            async def not_ready() -> bool:
                response = await http.get(readyz)
                return response.status_code == 503 and response.json()["pins_unavailable"] == ["rugpull"]

            await eventually_async(not_ready, RECOVERY_TIMEOUT, "/readyz naming the unreadable pins")
            # The first failed check waited a checkout timeout: the pool has been failing that long. The
            # outage lasts until its attempts, 1 s, 2 s, 4 s, 8 s apart, are 16 s from the next one.
            outage_ends = time.monotonic() + OUTAGE_SECONDS - DEFAULT_TIMEOUT
            while time.monotonic() < outage_ends:
                assert await not_ready()
                await anyio.sleep(0.2)
            await anyio.to_thread.run_sync(postgres_cluster.start)
            back = time.monotonic()

            async def ready() -> bool:
                return (await http.get(readyz)).status_code == 200

            await eventually_async(ready, RECOVERY_TIMEOUT, "/readyz 200 again")
            assert time.monotonic() - back <= READY_AGAIN_SECONDS, time.monotonic() - back


async def test_readyz_says_the_state_is_unavailable_while_every_call_needs_it(
    tmp_path: Path, postgres_cluster: Cluster, postgres_url: str
) -> None:
    """With rate limits on PostgreSQL every call takes a token from the shared buckets: while the
    database is down every call is refused, so the replica is not ready, and says why."""
    limits = {"per_agent": {"rate": 100, "burst": 100}}
    config = replica_config(tmp_path, "a", postgres_url, tmp_path / "log", rate_limits=limits)
    with http_gateway(config, env=KEY_ENV) as a:
        assert a.url is not None
        readyz = _readyz(a.url)
        async with httpx.AsyncClient(trust_env=False) as http:

            async def readiness(status: int) -> dict[str, Any] | None:
                response = await http.get(readyz)
                return response.json() if response.status_code == status else None

            before = await eventually_async(lambda: readiness(200), CALL_TIMEOUT, "/readyz 200")
            assert before["state_unavailable"] is False
            await anyio.to_thread.run_sync(postgres_cluster.stop)
            try:
                during = await eventually_async(lambda: readiness(503), CALL_TIMEOUT, "/readyz 503")
                assert during["state_unavailable"] is True and during["status"] == "not ready", during
                assert "postgresql" not in json.dumps(during)
                async with http_client(a.url) as client:
                    refused = await client.call_tool("rec.safe_read", {})
                assert refused.is_error and "state unavailable" in text_of(refused), text_of(refused)
            finally:
                await anyio.to_thread.run_sync(postgres_cluster.start)
            after = await eventually_async(lambda: readiness(200), RECOVERY_TIMEOUT, "/readyz 200 again")
            assert after["state_unavailable"] is False


async def test_pins_unreadable_while_postgresql_is_down_are_read_again_once_it_is_back(
    tmp_path: Path, postgres_cluster: Cluster, postgres_url: str
) -> None:
    """A pin check that failed during an outage is retried until it reads the pins; meanwhile /readyz
    says not ready, and neither the agent nor the log sees the database's password (given as a query
    parameter, which libpq reads and the trusting test cluster ignores)."""
    config = _pinning_replica(tmp_path, postgres_url + "?password=S3cretPw&connect_timeout=2")
    with http_gateway(config, env=KEY_ENV) as a:
        assert a.url is not None
        readyz = _readyz(a.url)
        async with http_client(a.url) as client, httpx.AsyncClient(trust_env=False) as http:
            await _stop_under_a_recheck(client, postgres_cluster, tmp_path)

            async def held() -> str | None:
                result = await client.call_tool("rugpull.echo", {"text": "x"})
                return text_of(result) if result.is_error and "pin store unavailable" in text_of(result) else None

            refusal = await eventually_async(held, RECOVERY_TIMEOUT, "the pins unreadable", ignoring=(MCPError,))
            assert "postgresql" not in refusal and "127.0.0.1" not in refusal and "S3cretPw" not in refusal, refusal
            during = await http.get(readyz)
            assert during.status_code == 503 and during.json()["pins_unavailable"] == ["rugpull"], during.text
            await anyio.to_thread.run_sync(postgres_cluster.start)
            await _until_ok(client, "rugpull.echo", RECOVERY_TIMEOUT, {"text": "x"})
            after = await http.get(readyz)
            assert after.status_code == 200 and after.json()["pins_unavailable"] == [], after.text
        assert "S3cretPw" not in a.text() and "password=***" in a.text()


async def test_the_drivers_own_warnings_follow_the_json_log_format(
    tmp_path: Path, postgres_cluster: Cluster, postgres_url: str
) -> None:
    """While PostgreSQL is down the pool's reconnection warnings (two lines from psycopg: the error and the
    server's hint) come out as one JSON object each, like every other line, without the password."""
    url = postgres_url + "?password=S3cretPw"
    config = replica_config(tmp_path, "a", url, tmp_path / "calls.log")
    with background(serve_argv(config, "--log-format", "json"), env=KEY_ENV) as a:
        assert a.wait_until(lambda text: a.url is not None), a.text()
        assert a.url is not None
        async with http_client(a.url) as client:
            await anyio.to_thread.run_sync(postgres_cluster.stop)
            with anyio.fail_after(CALL_TIMEOUT):
                refused = await client.call_tool("rec.delete_all", {"during": True})  # the pool reconnects
            assert refused.is_error and "state unavailable" in text_of(refused)
            seen = await anyio.to_thread.run_sync(
                lambda: a.wait_until(lambda text: '"logger":"psycopg' in text, RECOVERY_TIMEOUT)
            )
            assert seen, a.text()
            await anyio.to_thread.run_sync(postgres_cluster.start)
    lines = [line for line in a.text().splitlines() if line.strip()]
    objects = [json.loads(line) for line in lines]  # every line one object
    assert any(o["logger"].startswith("psycopg") for o in objects)
    assert "S3cretPw" not in a.text()


async def test_a_second_replica_under_a_running_replicas_id_does_not_start_nor_end_its_approvals(
    tmp_path: Path, postgres_url: str
) -> None:
    log = tmp_path / "calls.log"
    approval = {"timeout_seconds": 60, "non_blocking": True}
    config_a = replica_config(tmp_path, "a", postgres_url, log, approval=approval)
    twin = replica_config(tmp_path / "twin", "a", postgres_url, log, approval=approval)  # the same replica.id
    with http_gateway(config_a, env=KEY_ENV) as a:
        assert a.url is not None
        async with http_client(a.url) as on_a:
            with anyio.fail_after(CALL_TIMEOUT):
                asked = await on_a.call_tool("rec.delete_all", {"scope": "x"})
            approval_id = approval_id_of(text_of(asked))
        with pytest.raises(AssertionError) as refused:
            with http_gateway(twin, env=KEY_ENV):
                pass
        message = str(refused.value)
        assert "replica.id 'a' is in use by a running replica" in message and "Traceback" not in message, message
        async with httpx.AsyncClient(base_url=a.control(), headers=a.control_headers(), trust_env=False) as op_a:
            shown = (await op_a.get(f"/approvals/{approval_id}")).json()
            assert shown["status"] == "pending", shown  # the twin ended nothing
    with http_gateway(twin, env=KEY_ENV):  # once A is gone, the id is free for its restart
        pass
