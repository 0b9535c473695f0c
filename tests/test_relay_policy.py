"""``drawbridge wrap --policy``: the native policy engine decides, through the real command line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import mcp_types as types
import pytest
from conftest import ERAS, GITHUB_LIKE, PYTHON, child_env, connect, eventually_async, scaled, wrap_params
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

POLICY = """\
name: demo
agent: "claude"
rules:
  - tools: ["list_repos", "get_repo"]
    action: allow
  - tools: ["add_deploy_key"]
    action: human_approval
  - tools: ["delete_*"]
    action: deny
schemas:
  get_repo:
    type: object
    required: [owner, name]
    properties:
      owner: {type: string, maxLength: 10}
"""


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "demo.yaml").write_text(POLICY, encoding="utf-8")
    return directory


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_the_policy_decides_each_call(mode: str, policy_dir: Path) -> None:
    params = wrap_params(GITHUB_LIKE, "--policy", str(policy_dir), "--agent", "claude")
    async with connect(params, mode) as client:
        listed = await client.call_tool("list_repos", {"owner": "acme"})
        assert listed.structured_content == {"result": ["anvil", "rocket"]}
        deleted = await client.call_tool("delete_repo", {"owner": "acme", "name": "rocket"})
        assert deleted.is_error
        # The rule's own reason names it: said once, not after a label saying it again.
        assert _text(deleted) == "drawbridge refused this call: deny by rule 2 of policy 'demo' (demo.yaml:8)"
        approval = await client.call_tool("add_deploy_key", {"owner": "acme", "repo": "rocket", "title": "t", "key": "k"})
        assert _text(approval).startswith('drawbridge refused this call: policy "demo" rule 1 (human_approval): ')
        assert _text(approval).endswith(": approval unavailable")
        violating = await client.call_tool("get_repo", {"owner": "a-very-long-owner-name", "name": "rocket"})
        assert violating.is_error and "maxLength" in _text(violating)
        assert "a-very-long-owner-name" not in _text(violating)
        # A name the server does not list is refused before any rule is asked (as serve does).
        with pytest.raises(MCPError, match="unknown tool: the gateway serves no tool of this name"):
            await client.call_tool("get_env", {})
        # The denied deletion never happened.
        assert (await client.call_tool("list_repos", {"owner": "acme"})).structured_content == {
            "result": ["anvil", "rocket"]
        }


@pytest.mark.anyio
async def test_another_agent_falls_to_the_default_deny(policy_dir: Path) -> None:
    params = wrap_params(GITHUB_LIKE, "--policy", str(policy_dir), "--agent", "someone-else")
    async with connect(params) as client:
        refused = await client.call_tool("list_repos", {"owner": "acme"})
        assert _text(refused) == "drawbridge refused this call: default deny: no rule matched"


def test_a_policy_that_does_not_load_stops_the_gateway(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nagent: '*'\nrules:\n  - tools: ['*']\n    action: alow\n", encoding="utf-8")
    result = subprocess.run(
        [PYTHON, "-m", "drawbridge", "wrap", "--policy", str(bad), "--", *GITHUB_LIKE],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=scaled(30),
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert f"cannot load the policy {bad}" in result.stderr
    assert "bad.yaml:5" in result.stderr
    assert result.stdout == ""


class _GatewayLog:
    """The gateway's stderr, written to a file, read as it grows: the watcher's reload results."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        return self.path.read_text(encoding="utf-8", errors="replace").splitlines()

    def count(self, prefix: str) -> int:
        return sum(line.startswith(prefix) for line in self.lines())

    async def wait_for(self, prefix: str, occurrence: int = 1, timeout: float = scaled(15)) -> str:
        """The ``occurrence``-th line starting with ``prefix``, once the gateway has written it."""

        def found() -> str | None:
            lines = [line for line in self.lines() if line.startswith(prefix)]
            return lines[occurrence - 1] if len(lines) >= occurrence else None

        return await eventually_async(found, timeout, f"line {occurrence} starting {prefix!r}")


RELOADED = "drawbridge: INFO policies reloaded from "
REFUSED = "drawbridge: WARNING policy reload failed, keeping the previous policies: "


@pytest.mark.anyio
async def test_policy_edits_apply_to_the_next_call(policy_dir: Path, tmp_path: Path) -> None:
    params = wrap_params(GITHUB_LIKE, "--policy", str(policy_dir), "--agent", "claude", "--verbose")
    policy = policy_dir / "demo.yaml"
    log = _GatewayLog(tmp_path / "gateway.stderr")
    with log.path.open("w", encoding="utf-8") as errlog:
        async with connect(stdio_client(params, errlog=errlog)) as client:  # type: ignore[arg-type]
            assert not (await client.call_tool("list_repos", {"owner": "acme"})).is_error
            # A good edit: once the watcher says it reloaded, the very next call is decided by it.
            policy.write_text(POLICY.replace('["list_repos", "get_repo"]', '["get_repo"]'), encoding="utf-8")
            assert await log.wait_for(RELOADED) == f"{RELOADED}{policy_dir}: 1 policies"
            refused = await client.call_tool("list_repos", {"owner": "acme"})
            assert _text(refused) == "drawbridge refused this call: default deny: no rule matched"
            assert not (await client.call_tool("get_repo", {"owner": "acme", "name": "rocket"})).is_error
            # A broken edit: the watcher sees it and refuses it, naming the file and the line ...
            policy.write_text("this: [is not a policy", encoding="utf-8")
            line = await log.wait_for(REFUSED)
            assert line.startswith(f"{REFUSED}{policy}:1: invalid YAML: expected ',' or ']'"), line
            # ... and the last good set (the edited one, not the first) still decides.
            assert log.count(RELOADED) == 1
            assert not (await client.call_tool("get_repo", {"owner": "acme", "name": "rocket"})).is_error
            refused = await client.call_tool("list_repos", {"owner": "acme"})
            assert _text(refused) == "drawbridge refused this call: default deny: no rule matched"
            # A good edit after the broken one takes effect again.
            policy.write_text(POLICY, encoding="utf-8")
            assert await log.wait_for(RELOADED, occurrence=2) == f"{RELOADED}{policy_dir}: 1 policies"
            assert not (await client.call_tool("list_repos", {"owner": "acme"})).is_error
    assert log.count(REFUSED) == 1  # the broken edit is reported once, not at every poll
