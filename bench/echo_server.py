"""A minimal raw JSON-RPC MCP server over stdio with one tool, ``echo``: the upstream of bench/overhead.py.

No SDK on purpose: the server's own cost stays small and constant, so the difference between the
direct and the gateway runs is the gateway's.
"""

from __future__ import annotations

import json
import sys

TOOLS = [{"name": "echo", "description": "Echo the text back.",
          "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]


def main() -> None:
    out = sys.stdout
    for line in sys.stdin:
        message = json.loads(line)
        request_id = message.get("id")
        if request_id is None or "method" not in message:
            continue
        method = message["method"]
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "echo", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            text = message["params"].get("arguments", {}).get("text", "")
            result = {"content": [{"type": "text", "text": text}]}
        else:
            out.write(json.dumps({"jsonrpc": "2.0", "id": request_id,
                                  "error": {"code": -32601, "message": "method not found"}}) + "\n")
            out.flush()
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
