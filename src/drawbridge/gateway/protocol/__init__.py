"""The wire, sans-IO: JSON-RPC framing and strict parsing, MCP method names, the two protocol eras and
what changes when a message crosses the gateway. Bytes and dicts in, values out; no event loop."""
