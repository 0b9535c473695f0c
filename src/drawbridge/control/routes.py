"""The control plane's HTTP routes: catalogue, decisions, policy edits, pins, approvals, grants, shadow.

Invariant: every route is behind ``AdminAuth`` (``control_routes`` takes the admin digest as a
required argument and wraps each endpoint itself), answers JSON, and refuses with
``{"error": "<precise message>"}`` and a status that says why (``problems``: 400 malformed, 404
unknown, 405 a method the path does not serve, 409 a state that forbids the change, 413 too large,
422 a refused value, 503 the state store unreadable, 500 unexpected, without detail). No response
or log line carries a token, a raw argument value or an environment value: approvals show digests
and shapes (one pending approval read alone, its call's arguments as a person is shown them:
secret-like values masked, long values cut), tools show what the upstream declared, never the
gateway's configuration.

Theory of operation. ``control_routes(services, admin_token_sha256=...)`` returns Starlette
``Route`` objects; ``control_app`` wraps them in the app the gateway serves on a listener of its
own, apart from ``/mcp`` (an agent's endpoint and the operator's are never one listener). ``ControlPlane`` binds the
handlers to one ``ControlServices``: those of the catalogue, pins and policies
(``catalogue_handlers``) and those of approvals and grants (``approval_handlers``). Each handler
reads its input (``inputs``), calls one service, records what changed in the trace chain
(``mesh.policy_edit``, ``mesh.pin_accept``; approvals and grants are recorded by the engine and the
grant service) and renders the result. A change that cannot be recorded is not left in force where
it can be undone: a policy edit is rolled back from its ``.bak`` and the reload path. The route
table gives each path one endpoint for every method, so the admin check runs before a wrong method
is answered, and names the query parameters each method reads: any other is refused (400). The app
checks the token again before routing, so a path that does not exist answers 401, not 404, to a
caller without it: the routes cannot be probed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import Route

from drawbridge.canonical import sanitize
from drawbridge.control.approval_handlers import ApprovalHandlers
from drawbridge.control.auth import AdminAuth, AuthFirst
from drawbridge.control.catalogue_handlers import CatalogueHandlers
from drawbridge.control.evidence_handlers import EvidenceHandlers
from drawbridge.control.inputs import shown
from drawbridge.control.problems import Endpoint, error_response, handled
from drawbridge.control.services import ControlServices
from drawbridge.control.shadow_handlers import ShadowHandlers

ALL_METHODS: Final = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


class _AnyText(Convertor[str]):
    """Starlette's ``path``, line breaks included: a name holding one (``%0A``) reaches the handler,
    which refuses it as a bad name (400), instead of the route missing it (404 "no route")."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("drawbridge_text", _AnyText())


class ControlPlane(CatalogueHandlers, ApprovalHandlers, EvidenceHandlers, ShadowHandlers):
    """The handlers, bound to one ``ControlServices``."""

    def __init__(self, services: ControlServices) -> None:
        self.services = services


Handler = tuple[Endpoint, *tuple[str, ...]]
"""A method's handler, then the query parameters it reads (any other is refused, 400)."""


def _by_method(handlers: Mapping[str, Handler]) -> Endpoint:
    """One endpoint per path: a method the path does not serve is 405, a query parameter its handler
    does not read is 400, both answered after the admin check."""
    allowed = ", ".join(sorted(set(handlers) | ({"HEAD"} if "GET" in handlers else set())))

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        if method not in handlers:
            return JSONResponse(
                {"error": f"method {request.method} is not allowed here; allowed: {allowed}"},
                status_code=405,
                headers={"Allow": allowed},
            )
        handler, *params = handlers[method]
        unknown = sorted(set(request.query_params) - set(params))
        if unknown:
            names = ", ".join(shown(name, 40) for name in unknown[:5])
            return error_response(
                400, f"unknown query parameter(s) {names}; allowed: {', '.join(params) or 'none'}"
            )
        return await handler(request)

    return dispatch


def control_routes(services: ControlServices, *, admin_token_sha256: str) -> list[Route]:
    """The control plane's routes, each behind the admin check (a credential is always needed).

    Every request to one of these paths, whatever its method, is checked before anything else is
    answered (a wrong method is 405 only for an authorized caller).
    """
    auth = AdminAuth(admin_token_sha256)
    plane = ControlPlane(services)
    table: dict[str, dict[str, Handler]] = {
        "/tools": {"GET": (plane.tools,)},
        "/tools/decisions": {"GET": (plane.decisions, "agent")},
        "/tools/pins": {"GET": (plane.pins, "kind")},
        "/tools/pins/accept": {"POST": (plane.accept_pins,)},
        "/policies": {"GET": (plane.policies,)},
        "/policies/{target:drawbridge_text}": {"PUT": (plane.edit_policy,)},
        "/approvals": {"GET": (plane.approvals, "status", "tool", "agent", "limit")},
        "/approvals/{id}": {"GET": (plane.approval,)},
        "/approvals/{id}/approve": {"POST": (plane.approve,)},
        "/approvals/{id}/deny": {"POST": (plane.deny,)},
        "/grants": {"GET": (plane.grants, "all"), "POST": (plane.create_grant,)},
        "/grants/{id}": {"DELETE": (plane.revoke_grant, "by")},
        "/evidence/checkpoint": {"GET": (plane.checkpoint,)},
        "/shadow": {"GET": (plane.shadow,)},
    }
    routes = []
    for path, handlers in table.items():
        endpoint = _by_method({m: (handled(h), *params) for m, (h, *params) in handlers.items()})
        name = "control:" + "+".join(h.__name__ for h, *_ in handlers.values())
        routes.append(Route(path, auth.guard(endpoint), methods=list(ALL_METHODS), name=name))
    return routes


def control_app(
    services: ControlServices, *, admin_token_sha256: str, open_mounts: Sequence[str] = ()
) -> Starlette:
    """The control plane as an app of its own, on a listener apart from ``/mcp``. Every request is
    checked before it is routed (``AuthFirst``), so an unknown path is 404 only to a caller with the
    token; ``open_mounts`` (the web console, which has a login page and sessions of its own) are not."""

    async def not_found(request: Request, exc: Exception) -> Response:
        shown = sanitize(request.url.path)[:200]
        return error_response(
            404, f"no control-plane route {request.method} {shown}; see docs/control-plane.md"
        )

    return Starlette(
        routes=control_routes(services, admin_token_sha256=admin_token_sha256),
        exception_handlers={404: not_found},
        middleware=[Middleware(AuthFirst, auth=AdminAuth(admin_token_sha256), open_mounts=tuple(open_mounts))],
    )


__all__ = [
    "ControlPlane",
    "control_app",
    "control_routes",
]
