"""Upstream kinds: how a decided call reaches the server that runs it. MCP servers as stdio children
and over streamable HTTP, each behind one long-lived session."""
