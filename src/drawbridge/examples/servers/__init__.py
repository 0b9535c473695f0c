"""Example MCP servers (stdio) used by the demo and the tests."""
