"""How a control-plane request is refused: one status per reason, one JSON shape for every refusal.

Invariant: every failure of a handler becomes ``{"error": "<precise message>"}`` with a status
that says why: 400 the request is malformed (not JSON, a missing or mistyped field, an unknown
query value), 404 the thing named does not exist, 409 it exists but is in a state that forbids the
change (already resolved, written by hand, pinning off, an ambiguous id prefix), 413 the body is
too large, 422 the request is well formed but its value is refused (a duration out of bounds, a
malformed glob, a policy set that would not load), 503 the state store cannot be read, 500
anything unexpected, without detail: that answer and its log line name the exception's type only,
never its message, which may carry what a request or a store held.

Theory of operation. Handlers raise ``Problem`` for what they refuse themselves and let the
stores' and services' own errors through; ``handled`` wraps each endpoint and maps both
(``problem_for``), so the mapping from error to status lives here alone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from drawbridge.approval.durations import DurationError
from drawbridge.policy.globs import GlobError
from drawbridge.state.approvals import AlreadyResolved, ApprovalExpired, InvalidApproval
from drawbridge.state.grants import GrantAlreadyRevoked, InvalidGrant
from drawbridge.state.ids import AmbiguousId, InvalidId, UnknownId
from drawbridge.state.pins import InvalidPin, PinConflict, PinError, UnknownTool
from drawbridge.state.sqlite import StateUnavailable

logger = logging.getLogger("drawbridge.control")

Endpoint = Callable[[Request], Awaitable[Response]]


class Problem(Exception):
    """A refusal with its HTTP status; the message is already safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> JSONResponse:
    """The one shape of every refusal."""
    return JSONResponse({"error": message}, status_code=status)


def problem_for(exc: BaseException) -> Problem | None:
    """The HTTP refusal for an error raised by a store or a service, or None if it is unexpected."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, InvalidId):
        return Problem(400, str(exc))
    if isinstance(exc, UnknownId):
        return Problem(404, str(exc) or f"{exc.what} not found")
    if isinstance(exc, AmbiguousId):
        return Problem(409, str(exc))
    if isinstance(exc, ApprovalExpired):
        return Problem(409, f"approval {exc.approval.id} expired before this answer; the call was refused")
    if isinstance(exc, AlreadyResolved):
        return Problem(409, str(exc))
    if isinstance(exc, GrantAlreadyRevoked):
        return Problem(409, str(exc))
    if isinstance(exc, UnknownTool):
        return Problem(404, str(exc))
    if isinstance(exc, InvalidPin):
        return Problem(422, str(exc))
    if isinstance(exc, PinConflict):  # what was reviewed is not what the server offers now
        return Problem(409, str(exc))
    if isinstance(exc, PinError):  # no catalogue observed for the server
        return Problem(404, str(exc))
    if isinstance(exc, (InvalidApproval, InvalidGrant, DurationError, GlobError)):
        return Problem(422, str(exc))
    if isinstance(exc, StateUnavailable):
        return Problem(503, str(exc))
    return None


def handled(endpoint: Endpoint) -> Endpoint:
    """Turn service errors into JSON refusals; anything unexpected is a 500 without detail."""

    async def handler(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:  # noqa: BLE001 -- every failure must become a JSON answer
            problem = problem_for(exc)
            if problem is not None:
                return error_response(problem.status, problem.message)
            logger.error(
                "control plane: %s %s failed: %s", request.method, request.url.path, type(exc).__name__
            )
            return error_response(500, f"internal error ({type(exc).__name__}); see the gateway's log")

    handler.__name__ = getattr(endpoint, "__name__", "handler")
    handler.__doc__ = endpoint.__doc__
    return handler


__all__ = ["Endpoint", "Problem", "error_response", "handled", "problem_for"]
