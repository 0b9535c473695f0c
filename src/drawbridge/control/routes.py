"""The control plane's HTTP routes: catalogue, decisions, policy edits, pins, approvals, grants.

Invariant: every route is behind ``AdminAuth`` (``control_routes`` takes the admin digest as a
required argument and wraps each endpoint itself), answers JSON, and refuses with
``{"error": "<precise message>"}`` and a status that says why: 400 the request is malformed (not
JSON, a missing or mistyped field, an unknown query value), 404 the thing named does not exist,
409 it exists but is in a state that forbids the change (already resolved, written by hand,
pinning off, an ambiguous id prefix), 413 the body is too large, 422 the request is well formed
but its value is refused (a duration out of bounds, a malformed glob, a policy set that would not
load), 503 the state store cannot be read, 500 anything unexpected (no detail). No response or
log line carries a token, a raw argument value or an environment value: approvals show digests
and shapes, tools show what the upstream declared, never the gateway's configuration.

Theory of operation. ``control_routes(services, admin_token_sha256=...)`` returns Starlette
``Route`` objects for the gateway to mount beside ``/mcp``; ``control_app`` wraps them in an app
of their own (tests, or a control plane on a separate listener). Each handler reads its input,
calls one service (``ControlServices``), records what changed in the trace chain
(``mesh.policy_edit``, ``mesh.pin_accept``; approvals and grants are recorded by the engine and
the grant service) and renders the result. A change that cannot be recorded is not left in
force where it can be undone: a policy edit is rolled back from its ``.bak`` and the reload path.

Policy edit paths are read from the raw request path, so an agent or tool name holding ``/`` can
be sent percent-encoded (``/policies/team%2Fbot/tools/fs.read``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import unquote

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drawbridge.approval.channels import Channel
from drawbridge.approval.durations import DurationError
from drawbridge.canonical import CanonicalizationError, parse_json, sanitize
from drawbridge.catalogue.decisions import decision_table
from drawbridge.control.auth import AdminAuth
from drawbridge.control.services import (
    PIN_ACCEPT_KIND,
    ControlServices,
    current_catalogue,
)
from drawbridge.control.views import approval_view, grant_view, policy_view, tool_view
from drawbridge.policy.edit import EditRefused
from drawbridge.policy.globs import GlobError, compile_glob
from drawbridge.policy.model import PolicySet
from drawbridge.state.approvals import AlreadyResolved, ApprovalExpired, ApprovalStatus, InvalidApproval
from drawbridge.state.grants import GrantAlreadyRevoked, InvalidGrant
from drawbridge.state.ids import AmbiguousId, InvalidId, UnknownId
from drawbridge.state.pins import InvalidPin, PinError, UnknownTool
from drawbridge.state.policy_edits import (
    BACKUP_SUFFIX,
    POLICY_EDIT_KIND,
    EditApplied,
    apply_policy_edit_async,
    atomic_write,
)
from drawbridge.state.policy_store import PolicyStore
from drawbridge.state.sqlite import StateUnavailable

logger = logging.getLogger("drawbridge.control")

Endpoint = Callable[[Request], Awaitable[Response]]

MAX_BODY_BYTES: Final = 64 * 1024
MAX_NAME_CHARS: Final = 1024
DEFAULT_APPROVAL_LIMIT: Final = 100
MAX_APPROVAL_LIMIT: Final = 1000
RECENT_CALLS: Final = 10
PERSON_CHANNELS: Final = frozenset({Channel.CONTROL_PLANE, Channel.CONSOLE, Channel.CLI})
"""Channels a control-plane caller may name: all of them reach a person the admin token authenticated."""
APPROVAL_STATUSES: Final = ("pending", "approved", "denied", "expired", "all")


class Problem(Exception):
    """A refusal with its HTTP status; the message is already safe to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _shown(value: object, limit: int = 120) -> str:
    """A name from a request, fit for a message: sanitized, capped, quoted."""
    text = sanitize(str(value))
    if len(text) > limit:
        text = text[:limit] + "..."
    return json.dumps(text, ensure_ascii=False)


def _problem_for(exc: BaseException) -> Problem | None:
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
    if isinstance(exc, PinError):  # no catalogue observed for the server
        return Problem(404, str(exc))
    if isinstance(exc, (InvalidApproval, InvalidGrant, DurationError, GlobError)):
        return Problem(422, str(exc))
    if isinstance(exc, StateUnavailable):
        return Problem(503, str(exc))
    return None


def _handled(endpoint: Endpoint) -> Endpoint:
    """Turn service errors into JSON refusals; anything unexpected is a 500 without detail."""

    async def handler(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:  # noqa: BLE001 -- every failure must become a JSON answer
            problem = _problem_for(exc)
            if problem is not None:
                return _error(problem.status, problem.message)
            logger.error(
                "control plane: %s %s failed: %s", request.method, request.url.path, type(exc).__name__
            )
            return _error(500, f"internal error ({type(exc).__name__}); see the gateway's log")

    handler.__name__ = getattr(endpoint, "__name__", "handler")
    handler.__doc__ = endpoint.__doc__
    return handler


# ----------------------------------------------------------------------------------- request input


async def _json_body(request: Request, *, required: bool = True) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise Problem(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise Problem(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    if not body.strip():
        if required:
            raise Problem(400, "a JSON object body is required")
        return {}
    try:
        value = parse_json(bytes(body))
    except (CanonicalizationError, UnicodeDecodeError):
        raise Problem(400, "the request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise Problem(400, "the request body must be a JSON object")
    return value


def _check_keys(body: Mapping[str, Any], allowed: Sequence[str]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        shown = ", ".join(_shown(k, 40) for k in unknown[:5])
        raise Problem(400, f"unknown field(s) {shown}; allowed: {', '.join(allowed)}")


def _text(body: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise Problem(400, f"field {key!r} is required")
        return None
    if not isinstance(value, str):
        raise Problem(400, f"field {key!r} must be a string")
    if required and not value.strip():
        raise Problem(400, f"field {key!r} must not be empty")
    if len(value) > MAX_NAME_CHARS * 4:
        raise Problem(400, f"field {key!r} is longer than {MAX_NAME_CHARS * 4} characters")
    return value


def _caller(request: Request) -> str:
    """The default ``by`` when the body names nobody: the caller's address, as mesh7 records it."""
    host = request.client.host if request.client else "unknown"
    return f"http:{sanitize(host)[:64]}"


def _query(request: Request, key: str) -> str | None:
    values = request.query_params.getlist(key)
    if len(values) > 1:
        raise Problem(400, f"query parameter {key!r} is given more than once")
    return values[0] if values else None


def _truthy(value: str | None, key: str) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no", ""):
        return False
    raise Problem(400, f"query parameter {key!r} must be true or false")


def _seq(entry: Any) -> int | None:
    return entry.get("seq") if isinstance(entry, Mapping) else None


# --------------------------------------------------------------------------------------- handlers


class ControlPlane:
    """The handlers, bound to one ``ControlServices``."""

    def __init__(self, services: ControlServices) -> None:
        self.services = services

    # -- catalogue and decisions ------------------------------------------------------------------

    async def tools(self, request: Request) -> Response:
        """``GET /tools``: every served tool with its classification."""
        items = await current_catalogue(self.services.catalogue)
        return JSONResponse([tool_view(item) for item in items])

    async def decisions(self, request: Request) -> Response:
        """``GET /tools/decisions?agent=ID``: what the policy decides per tool for one agent."""
        agent = _query(request, "agent")
        if agent is None or not agent.strip():
            raise Problem(400, "query parameter 'agent' is required: GET /tools/decisions?agent=<id>")
        if len(agent) > MAX_NAME_CHARS:
            raise Problem(400, f"agent is longer than {MAX_NAME_CHARS} characters")
        items = await current_catalogue(self.services.catalogue)
        policy_set = self.services.policy_store.current
        rows = decision_table(policy_set, agent, [item.catalogue_tool() for item in items])
        out = []
        for item, row in zip(items, rows, strict=True):
            view = row.as_dict()
            view["server"] = item.server
            out.append(view)
        return JSONResponse(out)

    # -- policies ---------------------------------------------------------------------------------

    async def policies(self, request: Request) -> Response:
        """``GET /policies``: the policies in force, in evaluation order."""
        policy_set: PolicySet = self.services.policy_store.current
        return JSONResponse([policy_view(p) for p in policy_set.policies])

    async def edit_policy(self, request: Request) -> Response:
        """``PUT /policies/{agent}/tools/{tool}`` with ``{"action": ..., "by": ...}``."""
        agent, tool = _edit_target(request)
        body = await _json_body(request)
        _check_keys(body, ("action", "by"))
        action = _text(body, "action", required=True)
        by = _text(body, "by", required=True)
        assert action is not None and by is not None
        store = self.services.policy_store
        result = await apply_policy_edit_async(store, agent=agent, tool=tool, action=action, by=by)
        if isinstance(result, EditRefused):
            return _error(result.status, result.message)
        try:
            entry = await self.services.trace_append(POLICY_EDIT_KIND, result.trace_body())
        except Exception as exc:  # noqa: BLE001 -- an unrecorded edit must not stay in force
            logger.error("policy edit could not be recorded (%s); undoing it", type(exc).__name__)
            undone = await anyio.to_thread.run_sync(_undo_edit, store, result)
            return _error(
                500,
                "the edit could not be recorded in the trace chain, so "
                + ("it was undone" if undone is None else f"it was to be undone, but {undone}"),
            )
        view = result.trace_body()
        view.update(
            generation=result.generation,
            backup=None if result.backup is None else result.backup.name,
            trace_seq=_seq(entry),
        )
        return JSONResponse(view)

    # -- pins -------------------------------------------------------------------------------------

    def _pins(self) -> Any:
        if self.services.pins is None:
            raise Problem(409, "tool pinning is off (pin_tools: false): no tool is held back")
        return self.services.pins

    async def pins(self, request: Request) -> Response:
        """``GET /tools/pins``: held-back tools with the pinned and the current description."""
        held = await self._pins().held_back()
        return JSONResponse([tool.as_dict() for tool in held])

    async def accept_pins(self, request: Request) -> Response:
        """``POST /tools/pins/accept`` with ``{"server": S}`` or ``{"tools": [...]}`` (and ``by``)."""
        service = self._pins()
        body = await _json_body(request)
        _check_keys(body, ("server", "tools", "by"))
        server = _text(body, "server", required=False)
        tools = body.get("tools")
        by = _text(body, "by", required=False) or _caller(request)
        if (server is None) == (tools is None):
            raise Problem(400, 'give either "server" or "tools", not both and not neither')
        if server is not None:
            if not server.strip():
                raise Problem(400, "field 'server' must not be empty")
            if server not in service.servers():
                raise Problem(404, f"no upstream server named {_shown(server)}")
            groups: dict[str, list[str] | None] = {server: None}
        else:
            if not isinstance(tools, list) or not tools or not all(isinstance(t, str) and t for t in tools):
                raise Problem(400, 'field "tools" must be a non-empty list of tool names')
            groups = dict(await self._group_tools(service, tools))
        accepted: list[dict[str, Any]] = []
        for name, names in groups.items():
            changes = await service.accept(name, names, by=by)
            for change in changes:
                record = change.record()
                record["name"] = service.display_name(change.server, change.name)
                try:
                    entry = await self.services.trace_append(PIN_ACCEPT_KIND, record)
                except Exception as exc:  # noqa: BLE001
                    logger.error("pin acceptance could not be recorded: %s", type(exc).__name__)
                    raise Problem(
                        500,
                        f"pins of server {_shown(change.server)} were accepted but could not be recorded "
                        "in the trace chain; check the trace log",
                    ) from None
                record["trace_seq"] = _seq(entry)
                accepted.append(record)
        return JSONResponse({"accepted": accepted, "count": len(accepted)})

    async def _group_tools(self, service: Any, tools: list[str]) -> dict[str, list[str]]:
        """Agent-visible names -> upstream names, grouped by server; all resolved before any change."""
        by_name = {item.name: item for item in await current_catalogue(self.services.catalogue)}
        servers = list(service.servers())
        groups: dict[str, list[str]] = {}
        unknown: list[str] = []
        for name in tools:
            item = by_name.get(name)
            if item is not None:
                groups.setdefault(item.server, []).append(item.upstream_name)
                continue
            target = _split_known(name, servers, service)
            if target is None:
                unknown.append(name)
            else:
                groups.setdefault(target[0], []).append(target[1])
        if unknown:
            shown = ", ".join(_shown(n, 80) for n in unknown[:5])
            raise Problem(404, f"no served or pinned tool named {shown}")
        return groups

    # -- approvals --------------------------------------------------------------------------------

    async def approvals(self, request: Request) -> Response:
        """``GET /approvals``, most recent first; filters: ``status`` (pending, approved, denied, expired,
        all), ``tool`` (a glob), ``agent``, ``limit``."""
        status = _query(request, "status") or "all"
        if status not in APPROVAL_STATUSES:
            raise Problem(400, f"status must be one of {', '.join(APPROVAL_STATUSES)}")
        tool_glob = _query(request, "tool")
        matcher = None
        if tool_glob is not None:
            try:
                matcher = compile_glob(tool_glob)
            except GlobError as exc:
                raise Problem(400, f"query parameter 'tool' is not a valid glob: {exc}") from None
        agent = _query(request, "agent")
        limit_text = _query(request, "limit")
        limit = DEFAULT_APPROVAL_LIMIT
        if limit_text is not None:
            if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_APPROVAL_LIMIT:
                raise Problem(400, f"limit must be an integer from 1 to {MAX_APPROVAL_LIMIT}")
            limit = int(limit_text)
        store = self.services.approvals.store
        filtered = matcher is not None or agent is not None
        listed = await store.list(None if status == "all" else status, limit=None if filtered else limit)
        now = self.services.clock()
        out = []
        for approval in listed:
            if matcher is not None and not matcher.matches(approval.tool):
                continue
            if agent is not None and approval.agent != agent:
                continue
            out.append(approval_view(approval, now))
            if len(out) >= limit:
                break
        return JSONResponse(out)

    async def approval(self, request: Request) -> Response:
        """``GET /approvals/{id}``: one approval, the agent's active grants and recent calls."""
        approvals = self.services.approvals
        approval = await approvals.store.get(request.path_params["id"])
        now = self.services.clock()
        view = approval_view(approval, now)
        view["active_grants"] = [
            grant_view(g, now) for g in await approvals.grant_service.active_for_agent(approval.agent)
        ]
        recent: list[Any] = []
        if self.services.recent_calls is not None:
            recent = list(await self.services.recent_calls(view["agent"], RECENT_CALLS))
        view["recent_calls"] = recent
        return JSONResponse(view)

    async def approve(self, request: Request) -> Response:
        """``POST /approvals/{id}/approve``."""
        return await self._resolve(request, ApprovalStatus.APPROVED)

    async def deny(self, request: Request) -> Response:
        """``POST /approvals/{id}/deny``."""
        return await self._resolve(request, ApprovalStatus.DENIED)

    async def _resolve(self, request: Request, decision: ApprovalStatus) -> Response:
        body = await _json_body(request, required=False)
        _check_keys(body, ("resolved_by", "reason", "reasoning", "channel"))
        resolved_by = _text(body, "resolved_by", required=False) or _caller(request)
        reason = _text(body, "reason", required=False)
        reasoning = _text(body, "reasoning", required=False)
        if reason is not None and reasoning is not None:
            raise Problem(400, 'give "reason" or its alias "reasoning", not both')
        channel_text = _text(body, "channel", required=False) or Channel.CONTROL_PLANE.value
        try:
            channel = Channel(channel_text)
        except ValueError:
            channel = None
        if channel not in PERSON_CHANNELS:
            allowed = ", ".join(sorted(c.value for c in PERSON_CHANNELS))
            raise Problem(400, f"channel must be one of {allowed}")
        approval = await self.services.approvals.resolve(
            request.path_params["id"], decision, resolved_by, channel, reason or reasoning or ""
        )
        return JSONResponse(
            {
                "status": str(approval.status),
                "id": approval.id,
                "approval": approval_view(approval, self.services.clock()),
            }
        )

    # -- grants -----------------------------------------------------------------------------------

    async def grants(self, request: Request) -> Response:
        """``GET /grants[?all=true]``: grants in force now (every grant ever made with ``all``)."""
        everything = _truthy(_query(request, "all"), "all")
        service = self.services.approvals.grant_service
        now = self.services.clock()
        listed = await service.list(active_only=not everything)
        return JSONResponse([grant_view(g, now) for g in listed])

    async def create_grant(self, request: Request) -> Response:
        """``POST /grants`` with ``{"agent": GLOB, "tools": GLOB, "duration": "30m"}`` (and ``by``)."""
        body = await _json_body(request)
        _check_keys(body, ("agent", "tools", "duration", "by"))
        agent = _text(body, "agent", required=True)
        if isinstance(body.get("tools"), list):
            raise Problem(400, 'field "tools" is one glob string (e.g. "github.*"), not a list')
        tools = _text(body, "tools", required=True)
        duration = _text(body, "duration", required=True)
        by = _text(body, "by", required=False) or _caller(request)
        assert agent is not None and tools is not None and duration is not None
        service = self.services.approvals.grant_service
        try:
            grant = await service.create(agent=agent, tools=tools, duration=duration, granted_by=by)
        except ValueError as exc:
            raise _problem_for(exc) or Problem(422, str(exc)) from None
        return JSONResponse(grant_view(grant, self.services.clock()), status_code=201)

    async def revoke_grant(self, request: Request) -> Response:
        """``DELETE /grants/{id}[?by=NAME]``."""
        by = _query(request, "by") or _caller(request)
        if len(by) > MAX_NAME_CHARS:
            raise Problem(400, f"'by' is longer than {MAX_NAME_CHARS} characters")
        service = self.services.approvals.grant_service
        grant = await service.revoke(request.path_params["id"], revoked_by=by)
        return JSONResponse(
            {"status": "revoked", "id": grant.id, "grant": grant_view(grant, self.services.clock())}
        )


def _split_known(name: str, servers: Sequence[str], service: Any) -> tuple[str, str] | None:
    """``(server, upstream name)`` for a name no longer served (a pinned tool that went away)."""
    for server in servers:
        head, dot, upstream = name.partition(".")
        if dot and head == server and upstream and service.display_name(server, upstream) == name:
            return server, upstream
    return None


_POLICIES_PREFIX: Final = "/policies/"


def _edit_target(request: Request) -> tuple[str, str]:
    """``(agent, tool)`` from the raw path, so that a percent-encoded ``/`` stays inside its part."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, (bytes, bytearray)) else request.scope["path"]
    at = path.find(_POLICIES_PREFIX)
    parts = path[at + len(_POLICIES_PREFIX):].split("/") if at >= 0 else []
    if len(parts) < 3 or parts[1] != "tools" or not parts[0] or not "/".join(parts[2:]):
        raise Problem(404, "expected PUT /policies/{agent}/tools/{tool}")
    agent = unquote(parts[0], errors="strict")
    tool = unquote("/".join(parts[2:]), errors="strict")
    if len(agent) > MAX_NAME_CHARS or len(tool) > MAX_NAME_CHARS:
        raise Problem(400, f"agent and tool names are at most {MAX_NAME_CHARS} characters")
    return agent, tool


def _undo_edit(store: PolicyStore, applied: EditApplied) -> str | None:
    """Put the edited file back from its ``.bak`` and reload; None when done, else what went wrong."""
    path, backup = applied.path, applied.backup
    if path is None or backup is None:
        return None  # nothing was written
    try:
        written = applied.plan.new_text.encode("utf-8")
        current = path.read_bytes()
        kept = f"its previous bytes are in {path.name}{BACKUP_SUFFIX}"
        if current not in (written, b"\xef\xbb\xbf" + written):
            return f"{path.name} changed again meanwhile; {kept}"
        mode = path.stat().st_mode & 0o7777
        atomic_write(path, backup.read_bytes(), mode)
    except OSError as exc:
        return f"restoring {path.name} failed ({exc.strerror}); {kept}"
    error = store.reload()
    if error is not None:
        return f"the restored policies do not reload: {error}"
    return None


# ------------------------------------------------------------------------------------------ routes


ALL_METHODS: Final = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def _by_method(handlers: Mapping[str, Endpoint]) -> Endpoint:
    """One endpoint per path: a method the path does not serve is 405, answered after the admin check."""
    allowed = ", ".join(sorted(set(handlers) | ({"HEAD"} if "GET" in handlers else set())))

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        handler = handlers.get(method)
        if handler is None:
            return JSONResponse(
                {"error": f"method {request.method} is not allowed here; allowed: {allowed}"},
                status_code=405,
                headers={"Allow": allowed},
            )
        return await handler(request)

    return dispatch


def control_routes(services: ControlServices, *, admin_token_sha256: str | None) -> list[Route]:
    """The control plane's routes, each behind the admin check (None: loopback callers only).

    Every request to one of these paths, whatever its method, is checked before anything else is
    answered (a wrong method is 405 only for an authorized caller).
    """
    auth = AdminAuth(admin_token_sha256)
    plane = ControlPlane(services)
    table: dict[str, dict[str, Endpoint]] = {
        "/tools": {"GET": plane.tools},
        "/tools/decisions": {"GET": plane.decisions},
        "/tools/pins": {"GET": plane.pins},
        "/tools/pins/accept": {"POST": plane.accept_pins},
        "/policies": {"GET": plane.policies},
        "/policies/{target:path}": {"PUT": plane.edit_policy},
        "/approvals": {"GET": plane.approvals},
        "/approvals/{id}": {"GET": plane.approval},
        "/approvals/{id}/approve": {"POST": plane.approve},
        "/approvals/{id}/deny": {"POST": plane.deny},
        "/grants": {"GET": plane.grants, "POST": plane.create_grant},
        "/grants/{id}": {"DELETE": plane.revoke_grant},
    }
    routes = []
    for path, handlers in table.items():
        endpoint = _by_method({m: _handled(h) for m, h in handlers.items()})
        name = "control:" + "+".join(h.__name__ for h in handlers.values())
        routes.append(Route(path, auth.guard(endpoint), methods=list(ALL_METHODS), name=name))
    return routes


def control_app(services: ControlServices, *, admin_token_sha256: str | None) -> Starlette:
    """The control plane as an app of its own (tests; or a listener separate from ``/mcp``)."""

    async def not_found(request: Request, exc: Exception) -> Response:
        shown = sanitize(request.url.path)[:200]
        return _error(404, f"no control-plane route {request.method} {shown}; see docs/control-plane.md")

    return Starlette(
        routes=control_routes(services, admin_token_sha256=admin_token_sha256),
        exception_handlers={404: not_found},
    )


__all__ = [
    "ControlPlane",
    "Problem",
    "control_app",
    "control_routes",
    "policy_view",
    "tool_view",
]
