"""drawbridge: a fail-closed gateway between AI agents and the MCP servers they call."""

__version__ = "0.1.0"
