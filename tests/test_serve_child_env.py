"""The gateway's credentials stay the gateway's: a stdio upstream that ``serve`` starts (a real server
reporting which variables it holds) and the telemetry worker never inherit a variable the
configuration reads a credential from -- the admin's and the agents' tokens, the collector's header,
an HTTP upstream's header, an approval webhook's URL -- unless that upstream's own ``env`` sets it, with its own value."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import connect
from serve_support import CRASHY, stdio_params, write_config
from telemetry_support import Receiver

from drawbridge.config import parse_config
from drawbridge.gateway.runtime.serve import secret_env_names

pytestmark = pytest.mark.anyio

CREDENTIALS = {
    "GW_ADMIN_TOKEN": "admin-token-value", "GW_ALICE_TOKEN": "alice-token-value", "GW_BOB_TOKEN": "bob-token-value-b",
    "GW_OTLP_AUTH": "Bearer otlp-value", "GW_SEARCH_AUTH": "Bearer search-value",
    "GW_HOOK_URL": "http://127.0.0.1:9/hook-url-value",
}


def _worker_environments() -> list[bytes]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"telemetry_worker" in (entry / "cmdline").read_bytes():
                found.append((entry / "environ").read_bytes())
        except OSError:
            continue
    return found


async def test_no_child_inherits_a_credential_the_configuration_reads(tmp_path: Path) -> None:
    receiver = Receiver()
    search = {"name": "search", "transport": "streamable_http", "url": "http://127.0.0.1:9/mcp",
              "headers_env": {"Authorization": "GW_SEARCH_AUTH"}}
    # bob's token variable is passed on purpose, with the configuration's own value.
    crashy = {**CRASHY, "env": {"GW_BOB_TOKEN": "set-by-the-configuration"}}
    config = write_config(
        tmp_path, [crashy, search], control={"port": 0},
        auth={"admin": {"token_env": "GW_ADMIN_TOKEN"},
              "agents": [{"agent": "alice", "token_env": "GW_ALICE_TOKEN"},
                         {"agent": "bob", "token_env": "GW_BOB_TOKEN"}]},
        telemetry={"endpoint": receiver.url, "headers_env": {"Authorization": "GW_OTLP_AUTH"}},
        approval={"notify": [{"url_env": "GW_HOOK_URL"}]},
    )
    names = [*CREDENTIALS, "PATH"]
    try:
        async with connect(stdio_params(config, env=CREDENTIALS)) as client:
            seen = await client.call_tool("crashy.env", {"names": names})
            workers = _worker_environments()
    finally:
        receiver.close()
    assert seen.structured_content == {
        "GW_ADMIN_TOKEN": False, "GW_ALICE_TOKEN": False, "GW_BOB_TOKEN": True, "GW_OTLP_AUTH": False,
        "GW_SEARCH_AUTH": False, "GW_HOOK_URL": False, "PATH": True,
    }
    assert workers and not [env for env in workers for value in CREDENTIALS.values() if value.encode() in env]


def test_the_state_and_replica_credentials_are_named_too(tmp_path: Path) -> None:
    text = (
        "upstreams: [{name: a, transport: stdio, command: x}]\npolicy_dir: ./p\n"
        "state: {url_env: GW_PG_URL}\n"
        "replica: {id: r1, keys: {approval_binding: [{id: k1, env: GW_BIND_KEY}],"
        " request_state: [{id: k2, env: GW_STATE_KEY}]}}\n"
    )
    env = {"GW_PG_URL": "postgresql://u:pw@db/drawbridge", "GW_BIND_KEY": "ab" * 32, "GW_STATE_KEY": "cd" * 32}
    config = parse_config(text, str(tmp_path / "drawbridge.yaml"), env)
    assert {"GW_PG_URL", "GW_BIND_KEY", "GW_STATE_KEY"} <= secret_env_names(config)
