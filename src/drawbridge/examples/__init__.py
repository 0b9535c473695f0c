"""Example MCP servers and policies shipped for the demo."""
