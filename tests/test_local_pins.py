"""Pinning covers OpenAPI operations and CLI commands like MCP tools: the first start pins them, a
changed spec or a changed entry is a changed pin at the next start, held at ``human_approval``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from approval_support import text_of, trace, wait_pending_on
from conftest import connect, eventually, scaled
from openapi_support import SPEC, openapi_backend
from serve_support import http_client, http_gateway, stdio_params, write_config

from drawbridge.config_local import CliCommandConfig, CliToolConfig
from drawbridge.gateway.pipeline.call import CallPipeline
from drawbridge.gateway.pipeline.deciders import policy_decider
from drawbridge.gateway.pipeline.guard import EvidenceGuard
from drawbridge.gateway.serve.hub import Gateway
from drawbridge.gateway.upstreams.cli_tools.upstream import open_cli

pytestmark = pytest.mark.anyio

ALLOW_ALL = {"allow.yaml": "name: allow-all\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n"}


def _write(tmp_path: Path, spec: Path, api: str, git_flags: list[str]) -> Path:
    return write_config(
        tmp_path, [], policies=ALLOW_ALL, pin_tools=True,
        openapi=[{"name": "items", "file": str(spec), "backend_url": api, "allow_private": True}],
        cli_tools=[{"name": "git", "bin": "git", "strict": True, "working_dir": str(tmp_path),
                    "commands": {"log": {"allowed_args": git_flags}, "version": None}}],
        evidence_dir=str(tmp_path / "evidence"), state_path=str(tmp_path / "state.db"),
        auth={"anonymous_agent": "guest"}, approval={"timeout_seconds": 30, "elicitation": False},
    )


def _rows(gateway: Any) -> dict[str, dict[str, Any]]:
    """The decisions once both catalogues are checked against their pins: until a check completes, its
    tools show ``new`` (held back), and no tool of this test is new once checked."""

    def checked() -> dict[str, dict[str, Any]] | None:
        with httpx.Client(base_url=gateway.control(), trust_env=False, headers=gateway.control_headers()) as http:
            rows = {r["name"]: r for r in http.get("/tools/decisions", params={"agent": "guest"}).json()}
        return rows if rows and all(row["pin_status"] != "new" for row in rows.values()) else None

    return eventually(checked, what="both catalogues checked against their pins")


async def test_a_changed_spec_or_entry_is_a_changed_pin(tmp_path: Path) -> None:
    spec = tmp_path / "items.yaml"
    spec.write_text(SPEC.read_text())
    with openapi_backend() as backend:
        with http_gateway(_write(tmp_path, spec, backend.api, ["--oneline"])) as first:
            assert first.url is not None
            rows = _rows(first)
            assert {rows[n]["pin_status"] for n in ("items.get_item", "git.log", "git.version")} == {"pinned"}
            async with http_client(first.url) as client:
                ran = await client.call_tool("items.get_item", {"item_id": "1"})
                assert not ran.is_error
        # The operation's summary changes in the spec, and the allowed flags of one command.
        spec.write_text(SPEC.read_text().replace("summary: Read one item", "summary: Read one item, now better"))
        with http_gateway(_write(tmp_path, spec, backend.api, ["--oneline", "--output"])) as second:
            assert second.url is not None
            base, operator = second.control(), second.control_headers()
            rows = _rows(second)
            assert (rows["items.get_item"]["pin_status"], rows["git.log"]["pin_status"]) == ("changed", "changed")
            assert rows["items.list_items"]["pin_status"] == rows["git.version"]["pin_status"] == "pinned"
            assert rows["items.get_item"]["action"] == "human_approval" and rows["items.get_item"]["by_floor"]
            with httpx.Client(base_url=base, trust_env=False, headers=operator) as http:
                held = {t["name"]: t for t in http.get("/tools/pins").json()}
            assert set(held) == {"items.get_item", "git.log"}
            assert "now better" in held["items.get_item"]["current"]["description"]
            assert "now better" not in held["items.get_item"]["pinned"]["description"]
            assert "--output" in held["git.log"]["current"]["description"]
            async with http_client(second.url) as client, httpx.AsyncClient(
                base_url=base, trust_env=False, headers=operator
            ) as http:
                calls: list[Any] = []

                async def call() -> None:
                    calls.append(await client.call_tool("items.get_item", {"item_id": "1"}))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    pending = await wait_pending_on(http)
                    assert pending[0]["tool"] == "items.get_item"
                    await http.post(f"/approvals/{pending[0]['id']}/deny", json={"resolved_by": "op"})
                assert calls[0].is_error and "denied" in text_of(calls[0]).lower()
                unchanged = await client.call_tool("items.list_items", {"limit": 1})
                assert not unchanged.is_error
    first_use = [json.loads(line) for line in (tmp_path / "evidence" / "trace.ndjson").read_text().splitlines()]
    assert {e["body"]["server"] for e in first_use if e["kind"] == "mesh.pin_first_use"} == {"items", "git"}


async def test_a_session_that_lists_and_leaves_at_once_still_finds_the_check_recorded(tmp_path: Path) -> None:
    """``serve --stdio`` answers an agent only once its local upstreams' catalogues are checked: a
    session that lists the tools and disconnects at once (the process then ends) still leaves the
    check's records in the trace, at the first start (``mesh.pin_first_use``) and after a change
    (``mesh.pin_held_back``)."""
    evidence = tmp_path / "evidence"

    def config(flags: list[str]) -> Path:
        return write_config(
            tmp_path, [], policies=ALLOW_ALL, pin_tools=True, fsync="never",
            cli_tools=[{"name": "git", "bin": "git", "strict": True, "working_dir": str(tmp_path),
                        "commands": {"log": {"allowed_args": flags}}}],
            evidence_dir=str(evidence), state_path=str(tmp_path / "state.db"),
        )

    for flags, kind in ((["--oneline"], "mesh.pin_first_use"), (["--oneline", "--output"], "mesh.pin_held_back")):
        async with connect(stdio_params(config(flags), "--agent", "tester")) as client:
            with anyio.fail_after(scaled(30)):
                assert [tool.name for tool in (await client.list_tools()).tools] == ["git.log"]
        (recorded,) = trace(evidence, kind)
        assert recorded["body"]["server"] == "git"


async def test_the_hub_is_settled_only_once_each_local_catalogue_is_checked(tmp_path: Path) -> None:
    """What serve waits for before it answers an agent (``Gateway.wait_settled``) includes the first
    check of every local upstream's catalogue, however long the check takes."""
    release, checked = anyio.Event(), []

    async def slow_check(upstream: Any) -> bool:
        await release.wait()
        checked.append(upstream.name)
        return False

    async def record(event: Any) -> None:
        pass

    local = open_cli(CliToolConfig(name="git", bin="git", commands={"log": CliCommandConfig()}), os.environ, 30.0)
    policy = tmp_path / "allow.yaml"
    policy.write_text(ALLOW_ALL["allow.yaml"])
    pipeline = CallPipeline(policy=policy_decider(str(policy)), guard=EvidenceGuard(record))
    hub = Gateway([], pipeline=pipeline, on_catalogue=slow_check, local=[local])
    settled = anyio.Event()

    async def settle() -> None:
        await hub.wait_settled(scaled(30))
        settled.set()

    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)
        tg.start_soon(settle)
        await anyio.wait_all_tasks_blocked()
        assert not settled.is_set() and checked == []  # the check is still running: not settled
        release.set()
        with anyio.fail_after(scaled(10)):
            await settled.wait()
        assert checked == ["git"]
        tg.cancel_scope.cancel()
