"""Entry point of the ``drawbridge`` console script and of ``python -m drawbridge``.

Subcommands are found, not listed: every module ``drawbridge.cli.<name>_cmd``
contributes its ``command`` as ``drawbridge <name>`` (underscores become
hyphens). A module is imported only when its command is looked up, so each
subcommand pays only for its own imports. See ``drawbridge/cli/__init__.py``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

import click

import drawbridge
import drawbridge.cli

_SUFFIX = "_cmd"


def discovered_commands() -> dict[str, str]:
    """Command name -> module name for every ``*_cmd`` module of ``drawbridge.cli``."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(drawbridge.cli.__path__):
        if info.name.endswith(_SUFFIX) and len(info.name) > len(_SUFFIX):
            command_name = info.name[: -len(_SUFFIX)].replace("_", "-")
            found[command_name] = f"drawbridge.cli.{info.name}"
    return found


class DiscoveringGroup(click.Group):
    """A group that adds the commands of ``*_cmd`` modules, importing each on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(discovered_commands()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        module_name = discovered_commands().get(cmd_name)
        if module_name is None:
            return None
        module = importlib.import_module(module_name)
        command = getattr(module, "command", None)
        if not isinstance(command, click.Command):
            raise RuntimeError(f"{module_name} must define a click command or group named 'command'")
        if command.name != cmd_name:
            raise RuntimeError(
                f"{module_name} defines command {command.name!r}; its file name says {cmd_name!r}"
            )
        return command


@click.group(cls=DiscoveringGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(drawbridge.__version__, prog_name="drawbridge")
def cli() -> None:
    """drawbridge: a fail-closed gateway between AI agents and MCP servers.

    It decides every tools/call before it runs, helps write the policy that decides,
    and records evidence anyone can verify offline.
    """


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return its exit code (the console script exits with it)."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="drawbridge", standalone_mode=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        click.echo(str(exc.code), err=True)
        return 1
    return 0
