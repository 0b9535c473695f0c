"""What the console's pages and actions share: the control plane they act through and how they answer.

Invariant: pages are rendered by Jinja2 with autoescaping on, so a tool's description, an argument
value or a policy name shows as text, never as markup; every value a template writes first has each
control and format character (``canonical.escape_unsafe``: C0/C1 controls but line feed and tab, bidi
overrides and isolates, zero-width and tag characters, line and paragraph separators) written as a
visible ``\\uXXXX`` escape, so text an upstream wrote can neither hide words (tag characters read by a
model, unseen by a person) nor reorder them (U+202E): what is shown is what was sent; a page's notice or problem line is only ever
a message this gateway wrote for the viewer's session (``Session.remember``), looked up by the key
the redirect carries: text in a URL is never shown as the gateway's word; every answer carries ``Cache-Control:
no-store`` and a content security policy that allows only the console's own script and style.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from markupsafe import Markup

from drawbridge.approval.shown_arguments import argument_lines
from drawbridge.canonical import escape_unsafe
from drawbridge.control.auth import AdminAuth
from drawbridge.control.console.sessions import Session, SessionStore
from drawbridge.control.routes import ControlPlane
from drawbridge.control.services import ControlServices

HERE: Final = Path(__file__).parent
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class ConsoleBase:
    """What every console handler uses: the services, the control plane's handlers over them, the
    sessions, the templates, and how a page or an action's result is answered."""

    def __init__(
        self, services: ControlServices, auth: AdminAuth, trace_path: Path | None, surface_path: Path | None = None,
        truth_path: Path | None = None,
    ) -> None:
        self.services = services
        self.plane = ControlPlane(services)
        self.auth = auth
        self.sessions = SessionStore(services.clock)
        self.trace_path = trace_path
        self.surface_path = surface_path
        self.truth_path = truth_path
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            finalize=shown,
        )
        # A call's arguments read exactly as the CLI prints them: masked, cut, every unsafe character escaped.
        self.templates.filters["argument_lines"] = argument_lines
        self.templates.filters["marked"] = marked

    # -- rendering --------------------------------------------------------------------------------

    def render(self, request: Request, name: str, session: Session | None, status: int = 200, **values: Any) -> Response:
        note = session.note(request.query_params.get("note")) if session is not None else None
        html = self.templates.get_template(name).render(
            session=session,
            csrf=session.csrf if session is not None else "",
            notice=note.message if note is not None and note.ok else None,
            problem=note.message if note is not None and not note.ok else None,
            path=request.url.path,
            **values,
        )
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def answer(self, request: Request, back: str, message: str, status: int = 200) -> Response:
        """An action's result: JSON for a script, else a redirect back to the page, which shows the
        message kept in the session (the URL carries its key only, never the text)."""
        ok = status < 400
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"ok": ok, "message": message}, status_code=status, headers=SECURITY_HEADERS)
        session: Session = request.state.session
        separator = "&" if "?" in back else "?"
        query = urlencode({"note": session.remember(message, ok)})
        return RedirectResponse(f"{back}{separator}{query}", status_code=303, headers=SECURITY_HEADERS)


SHOWN_RAW: Final = "\n\t"
"""The only control characters a page writes as themselves: line feed and tab lay out a description
or an indented schema in a ``<pre>`` (the CLI's ``display_text`` keeps them too)."""


def shown(value: Any) -> Any:
    """Every value a template writes (Jinja's ``finalize``), with control and format characters escaped:
    a part of a page already marked safe stays markup (an escape adds no markup)."""
    if isinstance(value, Markup):
        return Markup(escape_unsafe(str(value), keep=SHOWN_RAW))
    if isinstance(value, str):
        return escape_unsafe(value, keep=SHOWN_RAW)
    return value


def marked(text: str, search: str) -> Markup:
    """``text`` with each occurrence of ``search`` (ignoring case) in ``<mark>``: what a search found is
    shown where it is. Every piece is escaped as markup here, and its unsafe characters by ``shown``."""
    needle = search.strip()
    if not needle:
        return Markup.escape(text)
    pieces = re.split(f"({re.escape(needle)})", text, flags=re.IGNORECASE)
    return Markup("").join(
        Markup("<mark>{}</mark>").format(piece) if index % 2 else Markup.escape(piece)
        for index, piece in enumerate(pieces)
    )


__all__ = ["CSP", "HERE", "SECURITY_HEADERS", "SHOWN_RAW", "ConsoleBase", "marked", "shown"]
