"""``drawbridge console``: where the web console is, and a browser opened on it when there is one.

The console is served by the control plane (``/console/``), so its URL is the control plane's,
found as every control-plane command finds it (``--url``, ``DRAWBRIDGE_URL``, ``--config``, else
``http://127.0.0.1:8788``). The command prints the URL and where the admin token to log in with is
(a file's path or a variable's name, never the token: it is located, not read, and need not be set
in the shell that asks), checks that a console answers there (its login page, which needs no
credential), and opens a browser only when one can be shown (a graphical session, or macOS and
Windows). Its errors are one ``drawbridge:`` line each.

Exit codes: 0 the console answers; 2 usage error, or nothing answers there as a console.
"""

from __future__ import annotations

import os
import sys
import webbrowser

import click
import httpx

from drawbridge.cli.control_client import Control, control_options, shown_url
from drawbridge.cli.output import EXIT_INPUT

PROBE_TIMEOUT = 5.0


def _browser_available() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@click.command(name="console", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--open/--no-open", "open_browser", default=True, show_default=True,
              help="Open a browser on the console when one can be shown.")
@control_options(formats=False, read_token=False)
def command(ctl: Control, open_browser: bool) -> None:
    """Print the web console's URL (and open it in a browser when there is one)."""
    url = f"{ctl.client.url}/console/"
    click.echo(shown_url(url))
    source = ctl.client.token_source
    click.echo(f"log in with the admin token from {source}" if source else
               "log in with the gateway's admin token (its path is on serve's startup line)", err=True)
    try:
        answer = httpx.get(f"{ctl.client.url}/console/login", timeout=PROBE_TIMEOUT)
    except httpx.HTTPError as exc:
        click.echo(f"drawbridge: no console answers at {shown_url(url)} ({type(exc).__name__}): "
                   "is the gateway running? set --url or DRAWBRIDGE_URL", err=True)
        sys.exit(EXIT_INPUT)
    if answer.status_code != 200 or 'name="token"' not in answer.text:
        click.echo(f"drawbridge: {shown_url(url)} answers HTTP {answer.status_code}, not as drawbridge's console",
                   err=True)
        sys.exit(EXIT_INPUT)
    if open_browser and _browser_available():
        webbrowser.open(url)
