"""The gateway shell: everything that moves bytes, waits, writes or keeps state around the pure core.

``protocol`` (the wire, sans-IO) · ``pipeline`` (the one tools/call lifecycle and its stages) ·
``recording`` (the evidence recorder) · ``upstreams`` (upstream kinds: MCP over stdio and HTTP) ·
``serve`` (many agents and upstreams behind one gateway) · ``transports`` (the agents' side: wrap's
stdio relay, serve over stdio and HTTP) · ``runtime`` (the one assembly every command uses).
docs/architecture.md draws the layers and the path of one call.
"""
