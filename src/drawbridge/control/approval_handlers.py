"""The control plane's approval queue and temporal grants: what a person decides for the agents' calls.

Invariant: a caller of these routes answers as a person: the channel it may name is one that
reaches a person the admin check let in (``PERSON_CHANNELS``: control plane, console, CLI), never
the gateway's own (memory, system), the agent's client (elicitation) or the gateway's terminal
(tty). An approval or a grant is
changed only through the engine (``ApprovalEngine.resolve``) and its grant service, which record the
change in the trace chain and wake the waiting call; these handlers record nothing themselves.
What they show of an approval is its digest and shape (``views.approval_view``); one pending
approval read alone (``GET /approvals/{id}``) also shows its call's arguments as the engine holds
them in memory for a person (secret-like values masked, long values cut), and only to a caller the
admin check let in. Lists carry no argument value: they stay small, and each value is a request away.

Theory of operation. ``ApprovalHandlers`` is a part of ``routes.ControlPlane``: each handler reads
its input (``inputs``), calls the approval engine or its grant service (``ControlServices.approvals``)
and renders the result. A list filtered by tool or agent reads the whole queue and applies the
limit to what passes the filter.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from drawbridge.approval.channels import Channel
from drawbridge.control.inputs import (
    MAX_NAME_CHARS,
    agent_glob,
    caller,
    check_keys,
    json_body,
    person,
    query_param,
    text_field,
    tool_glob,
    truthy,
)
from drawbridge.control.problems import Problem, problem_for
from drawbridge.control.services import ControlServices
from drawbridge.control.views import approval_view, arguments_view, grant_view
from drawbridge.policy.globs import GlobError, compile_glob
from drawbridge.state.approvals import ApprovalStatus

DEFAULT_APPROVAL_LIMIT: Final = 100
MAX_APPROVAL_LIMIT: Final = 1000
RECENT_CALLS: Final = 10
PERSON_CHANNELS: Final = frozenset({Channel.CONTROL_PLANE, Channel.CONSOLE, Channel.CLI})
"""Channels a control-plane caller may name: all of them reach a person the admin token authenticated."""
APPROVAL_STATUSES: Final = ("pending", "approved", "denied", "expired", "all")


class ApprovalHandlers:
    """The handlers of ``/approvals`` and ``/grants``, on the ``ControlServices`` of the plane."""

    services: ControlServices

    # -- approvals --------------------------------------------------------------------------------

    async def approvals(self, request: Request) -> Response:
        """``GET /approvals``, most recent first; filters: ``status`` (pending, approved, denied, expired,
        all), ``tool`` (a glob), ``agent``, ``limit``."""
        status = query_param(request, "status") or "all"
        if status not in APPROVAL_STATUSES:
            raise Problem(400, f"status must be one of {', '.join(APPROVAL_STATUSES)}")
        tool_glob = query_param(request, "tool")
        matcher = None
        if tool_glob is not None:
            try:
                matcher = compile_glob(tool_glob)
            except GlobError as exc:
                raise Problem(400, f"query parameter 'tool' is not a valid glob: {exc}") from None
        agent = query_param(request, "agent")
        limit_text = query_param(request, "limit")
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
        """``GET /approvals/{id}``: one approval, its call's arguments while pending, the agent's active
        grants and recent calls."""
        return JSONResponse(await self.approval_detail(request.path_params["id"]))

    async def approval_detail(self, id_or_prefix: str) -> dict[str, Any]:
        """One approval as ``GET /approvals/{id}`` shows it (also the console's)."""
        approvals = self.services.approvals
        approval = await approvals.store.get(id_or_prefix)
        now = self.services.clock()
        view = approval_view(approval, now)
        view["arguments"] = arguments_view(approval, approvals.shown_arguments(approval.id))
        view["this_replica"] = approvals.store.replica_id  # the CLI tells which replica holds them
        view["active_grants"] = [
            grant_view(g, now) for g in await approvals.grant_service.active_for_agent(approval.agent)
        ]
        recent: list[Any] = []
        if self.services.recent_calls is not None:
            recent = list(await self.services.recent_calls(view["agent"], RECENT_CALLS))
        view["recent_calls"] = recent
        return view

    async def approve(self, request: Request) -> Response:
        """``POST /approvals/{id}/approve``."""
        return await self._resolve(request, ApprovalStatus.APPROVED)

    async def deny(self, request: Request) -> Response:
        """``POST /approvals/{id}/deny``."""
        return await self._resolve(request, ApprovalStatus.DENIED)

    async def _resolve(self, request: Request, decision: ApprovalStatus) -> Response:
        body = await json_body(request, self.services.read_json, required=False)
        check_keys(body, ("resolved_by", "reason", "reasoning", "channel"))
        resolved_by = person(text_field(body, "resolved_by", required=False), "resolved_by") or caller(request)
        reason = text_field(body, "reason", required=False)
        reasoning = text_field(body, "reasoning", required=False)
        if reason is not None and reasoning is not None:
            raise Problem(400, 'give "reason" or its alias "reasoning", not both')
        channel_text = text_field(body, "channel", required=False) or Channel.CONTROL_PLANE.value
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
        everything = truthy(query_param(request, "all"), "all")
        service = self.services.approvals.grant_service
        now = self.services.clock()
        listed = await service.list(active_only=not everything)
        return JSONResponse([grant_view(g, now) for g in listed])

    async def create_grant(self, request: Request) -> Response:
        """``POST /grants`` with ``{"agent": GLOB, "tools": GLOB, "duration": "30m"}`` (and ``by``)."""
        body = await json_body(request, self.services.read_json)
        check_keys(body, ("agent", "tools", "duration", "by"))
        agent = text_field(body, "agent", required=True)
        if isinstance(body.get("tools"), list):
            raise Problem(400, 'field "tools" is one glob string (e.g. "github.*"), not a list')
        tools = text_field(body, "tools", required=True)
        duration = text_field(body, "duration", required=True)
        by = person(text_field(body, "by", required=False), "by") or caller(request)
        assert agent is not None and tools is not None and duration is not None
        agent, tools = agent_glob(agent, "agent"), tool_glob(tools, "tools")
        service = self.services.approvals.grant_service
        try:
            grant = await service.create(agent=agent, tools=tools, duration=duration, granted_by=by)
        except ValueError as exc:
            raise problem_for(exc) or Problem(422, str(exc)) from None
        return JSONResponse(grant_view(grant, self.services.clock()), status_code=201)

    async def revoke_grant(self, request: Request) -> Response:
        """``DELETE /grants/{id}[?by=NAME]``."""
        by = person(query_param(request, "by"), "by") or caller(request)
        if len(by) > MAX_NAME_CHARS:
            raise Problem(400, f"'by' is longer than {MAX_NAME_CHARS} characters")
        service = self.services.approvals.grant_service
        grant = await service.revoke(request.path_params["id"], revoked_by=by)
        return JSONResponse(
            {"status": "revoked", "id": grant.id, "grant": grant_view(grant, self.services.clock())}
        )


__all__ = ["APPROVAL_STATUSES", "PERSON_CHANNELS", "ApprovalHandlers"]
