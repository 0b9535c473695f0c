"""The parts of the mcp SDK that serve runs with: the SDK's own code, loaded without its package.

serve imports neither the SDK package (its client and server, OpenTelemetry) nor, until a 2026-07-28
request or an HTTP upstream needs the inbound ladder, the SDK's pydantic types; what it takes is the
SDK's code, so it decides as the SDK does.
"""

from __future__ import annotations

import json
import subprocess

import mcp.shared.inbound as sdk_inbound
import mcp.shared.uri_template as sdk_uri_template
from conftest import PYTHON, child_env, scaled

from drawbridge.gateway.upstreams import sdk_parts

PROBE_SECONDS = scaled(60.0)
"""How long the import probe (a fresh interpreter importing serve) may take."""
PROBE = """
import json, sys
import drawbridge.cli.main, drawbridge.cli.serve_cmd, drawbridge.gateway.runtime.serve
before = sorted({m.split(".")[0] for m in sys.modules} & {"mcp", "mcp_types", "pydantic", "httpx", "jsonschema"})
from drawbridge.gateway.upstreams.sdk_parts import inbound
inbound()
after = sorted({m.split(".")[0] for m in sys.modules} & {"mcp", "mcp_types", "pydantic"})
print(json.dumps([before, after]))
"""


def test_serve_loads_the_sdk_types_only_when_the_ladder_is_asked_for() -> None:
    result = subprocess.run(
        [PYTHON, "-c", PROBE], capture_output=True, text=True, env=child_env(), timeout=PROBE_SECONDS, check=True
    )
    before, after = json.loads(result.stdout)
    assert before == []  # no SDK package, no pydantic, no HTTP client, no JSON Schema at start
    assert after == ["mcp_types", "pydantic"]  # the ladder's types, still without the SDK package


def test_the_parts_are_the_sdks_own() -> None:
    assert sdk_parts.MCP_PROTOCOL_VERSION_HEADER == sdk_inbound.MCP_PROTOCOL_VERSION_HEADER
    assert sdk_parts.X_MCP_HEADER_KEY == sdk_inbound.X_MCP_HEADER_KEY
    ladder = sdk_parts.inbound()  # this process imported the SDK package: its own module
    assert ladder is sdk_inbound
    assert sdk_parts.UriTemplate.parse("repo/{owner}").match("repo/acme") == sdk_uri_template.UriTemplate.parse(
        "repo/{owner}"
    ).match("repo/acme")
    missing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {}}}
    ours, theirs = ladder.classify_inbound_request(missing), sdk_inbound.classify_inbound_request(missing)
    assert isinstance(ours, sdk_inbound.InboundLadderRejection) and ours == theirs
