"""The console's route table, its access check and how its pages are rendered.

Invariant: every console page needs a live session and every state-changing console request (POST)
also that session's CSRF token, checked before the handler runs; the only routes open without a
session are the login form, its POST (which needs the admin token in the ``token`` field) and the
static files (the pages name their icon there; a browser's own ``/favicon.ico``, asked after an
answer that names none, the control plane answers 404 unlogged: ``auth.AuthFirst``); a refused POST
changes nothing and is answered as JSON to a script, as a page leading to the login (or back to the
page to reload) to a browser's form. The admin token is read from the login form's body only: never from a URL, never
written into a page, a cookie or a log line (rendering: ``base``); a login it refuses is logged as
every refused credential is (``login_refused`` at WARNING: what was wrong, never the token).

Theory of operation. ``console_mount`` builds one ``Console`` over the control plane's
``ControlServices`` (the same objects the gateway decides calls with; the console changes nothing
except through the control plane's own handlers, ``routes.ControlPlane``) and returns a ``Mount`` at
``/console`` for the control plane's app. ``page`` and ``action`` wrap handlers with the session and
CSRF checks. An action answers a browser's form with a redirect back to its page (a one-line notice
kept in the session, the query naming it by a random key: ``sessions``) and a script's ``fetch`` (``Accept: application/json``) with ``{"ok", "message"}`` and
the status the control plane would have answered.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from drawbridge.activity_log import login_refused
from drawbridge.control.auth import AdminAuth
from drawbridge.control.console.actions import ActionHandlers
from drawbridge.control.console.base import HERE, SECURITY_HEADERS
from drawbridge.control.console.pages import PageHandlers
from drawbridge.control.console.sessions import COOKIE, COOKIE_PATH, Session, operator_name
from drawbridge.control.problems import Problem, problem_for
from drawbridge.control.services import ControlServices

CSRF_FIELD: Final = "csrf"
ACTION_PAGES: Final = frozenset({"tools", "approvals", "pins", "grants"})
"""The pages whose forms post to an action under them (``/console/<page>/...``)."""

Handler = Callable[[Request, Session], Awaitable[Response]]


class Console(PageHandlers, ActionHandlers):
    """The console's handlers, bound to one control plane's services."""

    # -- access -----------------------------------------------------------------------------------

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.find(request.cookies.get(COOKIE))

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A GET page: without a live session, the login form (with where to come back to)."""

        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            if session is None:
                target = urlencode({"next": request.url.path})
                return RedirectResponse(f"/console/login?{target}", status_code=303, headers=SECURITY_HEADERS)
            return await self._run(handler, request, session, request.url.path)

        return endpoint

    def action(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A POST: refused without a live session (401) or without its CSRF token (403), unread."""

        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            if session is None:  # refused unread: the page to come back to is the one the action is on
                return self._refuse(request, 401, "log in to the console first", _page_of(request.url.path))
            form = await request.form()
            field = form.get("back")
            back = _local(field if isinstance(field, str) else None)
            presented = form.get(CSRF_FIELD) or request.headers.get("x-csrf-token")
            if not isinstance(presented, str) or not session.csrf_matches(presented):
                return self._refuse(request, 403, "the console's form token is missing or wrong; reload the page", back)
            request.state.form = form
            request.state.session = session
            return await self._run(handler, request, session, back)

        return endpoint

    def _refuse(self, request: Request, status: int, message: str, back: str) -> Response:
        """A refused POST: JSON for a script, a page for a browser's form (pointing to the login, or back
        to the page to reload), with the same status either way; nothing was changed."""
        if "text/html" in request.headers.get("accept", "") and "application/json" not in request.headers.get("accept", ""):
            return self.render(request, "refused.html", None, status=status, refused=status, message=message, again=back)
        return JSONResponse({"error": message}, status_code=status, headers=SECURITY_HEADERS)

    async def _run(self, handler: Handler, request: Request, session: Session, back: str) -> Response:
        try:
            return await handler(request, session)
        except Exception as exc:  # noqa: BLE001 -- a failure is shown on the page, never as a traceback
            problem = problem_for(exc) or Problem(500, f"internal error ({type(exc).__name__}); see the gateway's log")
            if request.method == "GET":
                return self.render(request, "error.html", session, status=problem.status, message=problem.message)
            return self.answer(request, back, problem.message, problem.status)

    # -- login ------------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self.render(request, "login.html", None, next=_local(request.query_params.get("next")))

    async def login(self, request: Request) -> Response:
        form = await request.form()
        token, name = form.get("token"), form.get("operator")
        target = _local(form.get("next") if isinstance(form.get("next"), str) else None)
        operator = operator_name(name if isinstance(name, str) else None)
        if not isinstance(token, str) or not token or not self.auth.token_matches(token.encode()):
            client = request.client.host if request.client is not None else None
            login_refused("control_plane", "unknown_token" if isinstance(token, str) and token else "missing",
                          client, path=request.url.path)
            return self.render(request, "login.html", None, status=401, next=target,
                               error="That is not the admin token.")
        if operator is None:
            return self.render(request, "login.html", None, status=400, next=target,
                               error="Give your name (printable, at most 80 characters): it is recorded on what you do.")
        session_id, session = self.sessions.open(operator)
        response = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
        response.set_cookie(
            COOKIE, session_id, max_age=int(self.sessions.ttl.total_seconds()), path=COOKIE_PATH,
            httponly=True, samesite="strict", secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request, session: Session) -> Response:
        self.sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse("/console/login", status_code=303, headers=SECURITY_HEADERS)
        response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
        return response


def _local(target: str | None) -> str:
    """Where to go after login: a console path only (never another site)."""
    if target and target.startswith("/console/") and "//" not in target and "\\" not in target:
        return target
    return "/console/"


def _page_of(action: str) -> str:
    """The page an action's form is on (``/console/tools/action`` is on ``/console/tools``)."""
    section = action.removeprefix("/console/").split("/", 1)[0]
    return f"/console/{section}" if section in ACTION_PAGES else "/console/"


def console_mount(
    services: ControlServices, *, admin_token_sha256: str, trace_path: Path | None = None,
    surface_path: Path | None = None, truth_path: Path | None = None,
) -> Mount:
    """The console at ``/console`` for the control plane's app (its listener and its credential);
    ``trace_path``, ``surface_path`` and ``truth_path`` are the gateway's trace, surface record and
    truth carrier files, if it writes them."""
    console = Console(services, AdminAuth(admin_token_sha256), trace_path, surface_path, truth_path)
    page, action = console.page, console.action
    routes = [
        Route("/", page(console.overview), methods=["GET"]),
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", action(console.logout), methods=["POST"]),
        Route("/tools", page(console.tools_page), methods=["GET"]),
        Route("/tools/action", action(console.set_action), methods=["POST"]),
        Route("/approvals", page(console.approvals_page), methods=["GET"]),
        Route("/approvals/pending", page(console.pending_fragment), methods=["GET"]),
        Route("/approvals/{id}", page(console.approval_page), methods=["GET"]),
        Route("/approvals/{id}/{decision:str}", action(console.resolve), methods=["POST"]),
        Route("/pins", page(console.pins_page), methods=["GET"]),
        Route("/pins/accept", action(console.accept_pins), methods=["POST"]),
        Route("/grants", page(console.grants_page), methods=["GET"]),
        Route("/grants", action(console.create_grant), methods=["POST"]),
        Route("/grants/{id}/revoke", action(console.revoke_grant), methods=["POST"]),
        Route("/evidence", page(console.evidence_page), methods=["GET"]),
    ]
    routes.append(Mount("/static", app=StaticFiles(directory=HERE / "static"), name="console-static"))
    return Mount("/console", routes=routes)


__all__ = ["CSRF_FIELD", "Console", "console_mount"]
