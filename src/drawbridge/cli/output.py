"""How every subcommand prints: one JSON object for machines, rich tables for people.

Invariant: text that came from an input file (tool names, record ids, reasons
copied from imported records) or from a call (argument values) reaches the
terminal only as plain text (``rich.text.Text``, or ``click.echo`` of
``display_text``) with control characters replaced (in a table cell line feeds
and tabs too, so that no value reads as a row of its own), never as console
markup: a hostile value like ``[red]`` or an escape sequence prints as itself,
not as formatting. JSON output writes every character that could steer a
terminal (controls, C1 included, bidi and other format characters, line and
paragraph separators) as a JSON escape, so it reads as the same JSON.

Exit codes shared by the evidence commands live here too, so every command
means the same thing by them: 0 verified, 1 verification failed, 2 usage
error or unreadable input.

rich is imported by the functions that draw, not by this module: the gateway commands (wrap, serve)
import the exit codes and ``InputError`` and never draw a table, and rich weighs several MiB.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

from drawbridge.canonical import escape_unsafe, sanitize

# Carriage return and the bidirectional overrides can make a terminal show other
# text than the report holds; they print as U+FFFD too.
_DISPLAY_UNSAFE = str.maketrans(
    {c: "\ufffd" for c in "\r\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"}
)

# In a table cell a line feed (or a tab) would start what reads as another row.
_CELL_UNSAFE = str.maketrans({"\n": "\ufffd", "\t": "\ufffd"})

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2


def agent_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--agent ID`` checked as the configuration checks agent ids (``config_reader.AGENT_ID``)."""
    from drawbridge.config_reader import AGENT_ID, AGENT_ID_CHARS

    if value is not None and not AGENT_ID.fullmatch(value):
        raise click.BadParameter(f"an agent id uses only {AGENT_ID_CHARS}")
    return value

FORMATS = ("table", "json")

F = TypeVar("F", bound=Callable[..., Any])


class InputError(click.ClickException):
    """Unreadable or unusable input: exit code 2, message on stderr."""

    exit_code = EXIT_INPUT


def format_option(func: F) -> F:
    """The ``--format json|table`` option every report-printing command takes."""
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table: for people (rich); json: the machine report, one JSON object.",
    )(func)


def emit_json(report: Any) -> None:
    """Print one JSON object; what could steer a terminal is escaped (the same JSON, read back)."""
    click.echo(escape_unsafe(json.dumps(report, indent=2, ensure_ascii=False), keep="\n"))


def console() -> Console:
    """A stdout console; wide when not a terminal, so that digests are never folded in pipes."""
    from rich.console import Console

    return Console(
        file=sys.stdout,
        width=None if sys.stdout.isatty() else 200,
        highlight=False,
        soft_wrap=False,
    )


def plain(value: Any, *, cell: bool = False) -> Text:
    """Text from data: never markup, control characters replaced (in a ``cell``, LF and TAB too)."""
    from rich.text import Text

    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return Text((cell_text if cell else display_text)(str(value)))


def display_text(value: str) -> str:
    """Text safe to show on a terminal: Cc controls (but TAB, LF), CR and bidi overrides -> U+FFFD."""
    return sanitize(value).translate(_DISPLAY_UNSAFE)


def cell_text(value: str) -> str:
    """Text for one table cell: as ``display_text``, and LF and TAB -> U+FFFD too, so that a value
    cannot break its cell into lines that read as rows of their own."""
    return display_text(value).translate(_CELL_UNSAFE)


def verdict(ok: bool, yes: str = "VERIFIED", no: str = "FAILED") -> Text:
    from rich.text import Text

    return Text(yes, style="bold green") if ok else Text(no, style="bold red")


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> Table:
    """A table whose title and cells are plain text (see ``plain``): a title names paths and agents."""
    from rich.table import Table
    from rich.text import Text

    out = Table(title=plain(title), title_justify="left", show_lines=False)
    for name in columns:
        out.add_column(name, overflow="fold")
    for row in rows:
        out.add_row(*(cell if isinstance(cell, Text) else plain(cell, cell=True) for cell in row))
    return out


def key_values(title: str, pairs: Iterable[tuple[str, Any]]) -> Table:
    """A two-column summary table; its title is plain text, as in ``table``."""
    from rich.table import Table
    from rich.text import Text

    out = Table(title=plain(title), title_justify="left", show_header=False)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for key, value in pairs:
        out.add_row(key, value if isinstance(value, Text) else plain(value, cell=True))
    return out
