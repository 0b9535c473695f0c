"""``drawbridge wrap``: a call that needs a person runs when, and only when, a person approves it.

Real processes throughout: the gateway, a GitHub-like server whose state the calls change, an mcp SDK
client (2025-11-25 era), the control plane over HTTP and the ``drawbridge approvals`` command.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from approval_support import (
    ControlPlane,
    Person,
    cli,
    decisions,
    listed,
    text_of,
    trace,
    wrap_flags,
    write_policy,
)
from conftest import GITHUB_LIKE, connect, scaled, wrap_params
from serve_support import free_port

pytestmark = pytest.mark.anyio

TRUTH_ENV = {"DRAWBRIDGE_TDT_HMAC_KEY": "approval-truth-key-0123456789abcdef", "DRAWBRIDGE_TDT_HMAC_KEY_ID": "kid-a"}
ROCKET = {"owner": "acme", "name": "rocket"}
ANVIL = {"owner": "acme", "name": "anvil"}


async def test_elicitation_approve_runs_the_call_and_decline_refuses_it(tmp_path: Path) -> None:
    evidence, carriers = tmp_path / "evidence", tmp_path / "carriers.ndjson"
    flags = wrap_flags(write_policy(tmp_path), evidence, "--tool-decision-truth-out", str(carriers))
    yes, no = Person("approve"), Person(action="decline")

    async with connect(wrap_params(GITHUB_LIKE, *flags, env=TRUTH_ENV), elicitation_callback=no) as client:
        refused = await client.call_tool("delete_repo", ROCKET)
        assert refused.is_error and "declined in the client" in text_of(refused)
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil", "rocket"]
    (question,) = no.questions
    assert "delete_repo" in question and '\n/name: "rocket"' in question

    async with connect(wrap_params(GITHUB_LIKE, *flags, env=TRUTH_ENV), elicitation_callback=yes) as client:
        done = await client.call_tool("delete_repo", ROCKET)
        assert not done.is_error and text_of(done) == "deleted acme/rocket"
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil"]
    assert len(yes.questions) == 1

    resolved = [e["body"] for e in trace(evidence, "approval_resolved")]
    assert [(r["status"], r["channel"], r["strength"]) for r in resolved] == [
        ("denied", "elicitation", "client"),
        ("approved", "elicitation", "client"),
    ]
    assert all(r["resolved_by"] == "mcp-client:tester" for r in resolved)
    first, second = decisions(evidence, "delete_repo")
    assert (first["action"], first["outcome"], first["approval"]["settled"]) == ("deny", "refused", "deny")
    assert (second["action"], second["outcome"]) == ("allow", "ok")
    assert second["approval"] == {
        "settled": "allow",
        "how": "approved by mcp-client:tester via elicitation",
        "approval_id": resolved[1]["approval_id"],
        "resolved_by": "mcp-client:tester",
        "channel": "elicitation",
        "strength": "client",
    }
    surface = [json.loads(line)["observed_tool_decisions"][0] for line in (evidence / "tool-decisions.ndjson").read_text().splitlines()]
    deletes = [d for d in surface if d["tool"]["name"] == "delete_repo"]
    assert [d["decision"]["effect"] for d in deletes] == ["deny", "allow"]
    assert deletes[1]["response"]["side_effect_asserted"] is True
    # The truth carriers: the approval axis is observed only for the call a person approved.
    rows = [json.loads(line) for line in carriers.read_text().splitlines()]
    verdicts = [r["decision_verdict"] for r in rows if r["tool_name"] == "delete_repo"]
    assert verdicts == ["incomplete", "match"]
    assert cli("evidence", "verify-chain", str(evidence / "trace.ndjson")).returncode == 0


async def test_control_plane_and_cli_approvals_release_waiting_calls(tmp_path: Path) -> None:
    evidence, port = tmp_path / "evidence", free_port()
    flags = wrap_flags(write_policy(tmp_path), evidence, "--control-port", str(port))
    control = ControlPlane(port, evidence)
    async with connect(wrap_params(GITHUB_LIKE, *flags)) as client:  # no elicitation callback
        async with anyio.create_task_group() as tg:
            results: dict[str, object] = {}

            async def call(name: str, arguments: dict[str, str]) -> None:
                results[name] = await client.call_tool(name, arguments)

            tg.start_soon(call, "delete_repo", ROCKET)
            (waiting,) = await control.wait_pending(1)
            assert waiting["tool"] == "delete_repo" and waiting["agent"] == "tester"
            assert "rocket" not in json.dumps(waiting)  # digests and shapes only
            assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil", "rocket"]
            detail = await control.get(f"/approvals/{waiting['id']}")
            recent = detail["recent_calls"]
            assert [c["tool"] for c in recent] == ["list_repos"] and recent[0]["outcome"] == "ok"
            response = await control.approve(waiting["id"])
            assert response.status_code == 200 and response.json()["status"] == "approved"
        assert text_of(results["delete_repo"]) == "deleted acme/rocket"  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "add_deploy_key", {"owner": "acme", "repo": "anvil", "title": "ci", "key": "ssh-ed25519 A"})
            (waiting,) = await control.wait_pending(1)
            done = await anyio.to_thread.run_sync(
                lambda: cli("approvals", "approve", waiting["short_id"], "--by", "op-carol", *control.cli_args())
            )
            assert done.returncode == 0, done.stderr
        assert "deploy key 'ci' added" in text_of(results["add_deploy_key"])  # type: ignore[arg-type]
        # A second answer to a used approval changes nothing.
        assert (await control.deny(waiting["id"])).status_code == 409

    resolved = [e["body"] for e in trace(evidence, "approval_resolved")]
    assert [(r["resolved_by"], r["channel"], r["strength"]) for r in resolved] == [
        ("op-alice", "control_plane", "operator"),
        ("op-carol", "cli", "operator"),
    ]
    assert [d["approval"]["channel"] for d in decisions(evidence) if "approval" in d] == ["control_plane", "cli"]


async def test_an_approval_through_another_channel_runs_a_call_being_asked_in_band(tmp_path: Path) -> None:
    """The client is being asked and never answers; the operator's approval runs the call anyway."""
    evidence, port = tmp_path / "evidence", free_port()
    flags = wrap_flags(write_policy(tmp_path), evidence, "--control-port", str(port))
    control = ControlPlane(port, evidence)
    asked = anyio.Event()

    async def silent(context: object, params: object) -> object:
        asked.set()
        await anyio.sleep_forever()

    async with connect(wrap_params(GITHUB_LIKE, *flags), elicitation_callback=silent) as client:
        async with anyio.create_task_group() as tg:
            results: list[object] = []

            async def call() -> None:
                results.append(await client.call_tool("delete_repo", ANVIL))

            tg.start_soon(call)
            with anyio.fail_after(scaled(15)):
                await asked.wait()
            (waiting,) = await control.wait_pending(1)
            assert (await control.approve(waiting["id"], by="op-dana")).status_code == 200
        assert text_of(results[0]) == "deleted acme/anvil"  # type: ignore[arg-type]
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["rocket"]
    (resolved,) = [e["body"] for e in trace(evidence, "approval_resolved")]
    assert (resolved["resolved_by"], resolved["channel"]) == ("op-dana", "control_plane")


async def test_nobody_answers_then_the_timeout_denies(tmp_path: Path) -> None:
    evidence, port = tmp_path / "evidence", free_port()
    flags = wrap_flags(write_policy(tmp_path), evidence, "--control-port", str(port), "--approval-timeout", "1")
    control = ControlPlane(port, evidence)
    async with connect(wrap_params(GITHUB_LIKE, *flags)) as client:
        with anyio.fail_after(scaled(10)):
            refused = await client.call_tool("delete_repo", ROCKET)
        assert refused.is_error and "timed out" in text_of(refused)
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil", "rocket"]
        (expired,) = await control.get("/approvals", status="expired")
        assert (await control.approve(expired["id"])).status_code == 409  # too late: nothing runs
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil", "rocket"]
    (resolved,) = [e["body"] for e in trace(evidence, "approval_resolved")]
    assert (resolved["status"], resolved["resolved_by"], resolved["outcome"]) == ("expired", "system:timeout", "deny")
    (decision,) = decisions(evidence, "delete_repo")
    assert decision["approval"]["how"] == "timeout" and decision["outcome"] == "refused"


async def test_concurrent_approvals_of_different_calls_each_decide_their_own_call(tmp_path: Path) -> None:
    evidence, port = tmp_path / "evidence", free_port()
    flags = wrap_flags(write_policy(tmp_path), evidence, "--control-port", str(port))
    control = ControlPlane(port, evidence)
    key = {"owner": "acme", "repo": "anvil", "title": "deploy", "key": "ssh-ed25519 B"}
    async with connect(wrap_params(GITHUB_LIKE, *flags)) as client:
        results: dict[str, object] = {}

        async def call(name: str, arguments: dict[str, str]) -> None:
            results[name] = await client.call_tool(name, arguments)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "delete_repo", ROCKET)
            tg.start_soon(call, "add_deploy_key", key)
            waiting = {a["tool"]: a for a in await control.wait_pending(2)}
            assert set(waiting) == {"delete_repo", "add_deploy_key"}
            # Answered in the opposite order of asking; each answer reaches its own call only.
            assert (await control.approve(waiting["add_deploy_key"]["id"])).status_code == 200
            assert (await control.deny(waiting["delete_repo"]["id"])).status_code == 200
        assert "deploy key 'deploy' added" in text_of(results["add_deploy_key"])  # type: ignore[arg-type]
        refused = results["delete_repo"]
        assert refused.is_error and "denied by op-bob" in text_of(refused)  # type: ignore[attr-defined]
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil", "rocket"]
    resolved = {e["body"]["tool"]: e["body"]["status"] for e in trace(evidence, "approval_resolved")}
    assert resolved == {"add_deploy_key": "approved", "delete_repo": "denied"}


async def test_a_client_that_answers_the_question_with_an_error_gets_a_refusal_at_once(tmp_path: Path) -> None:
    """Nobody but the client could answer (no control plane, no shared state file): its error ends the
    approval now, recorded as the system's, instead of leaving the call to wait for the timeout."""
    evidence = tmp_path / "evidence"
    flags = wrap_flags(write_policy(tmp_path), evidence, "--approval-timeout", "120")
    questions: list[str] = []

    async def failing(context: object, params: types.ElicitRequestParams) -> types.ErrorData:
        questions.append(params.message)
        return types.ErrorData(code=-32603, message="nobody can be asked here")

    async with connect(wrap_params(GITHUB_LIKE, *flags), elicitation_callback=failing) as client:
        with anyio.fail_after(scaled(20)):
            refused = await client.call_tool("delete_repo", ROCKET)
        assert refused.is_error and "answered the approval question with an error" in text_of(refused)
        assert listed(await client.call_tool("list_repos", {"owner": "acme"})) == ["anvil", "rocket"]
    assert len(questions) == 1
    (resolved,) = [e["body"] for e in trace(evidence, "approval_resolved")]
    assert (resolved["status"], resolved["resolved_by"], resolved["channel"]) == (
        "expired", "system:unanswerable", "system",
    )
    (decision,) = decisions(evidence, "delete_repo")
    assert decision["outcome"] == "approval_unavailable"
    assert cli("evidence", "verify-chain", str(evidence / "trace.ndjson")).returncode == 0
