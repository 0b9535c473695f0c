"""What an operator changes from the console: a tool's action for an agent, an approval, pins, grants.

Invariant: a tool's action is set only for the agent the page showed: its form carries the agent it
sets (``agent``) and the agent the page named (``shown_agent``), and the two must be the same. Every
change goes through the control plane's own path (``ControlPlane.policy_edit``,
``accept_pin_groups``, the approval engine's ``resolve``, the grant service), so it is applied,
recorded in the trace chain and refused exactly as the JSON routes apply, record and refuse it; the
console adds only who did it: the operator named at login is the ``by`` of every change, and an
approval resolved here has the ``console`` channel (operator strength). Every handler here runs
only after ``app.Console.action`` checked the session and its CSRF token.

Theory of operation. ``ActionHandlers`` is a part of ``app.Console``. Each reads the form the
access check already parsed (``request.state.form``), calls one service and answers through
``Console.answer``: a redirect back to the page with a one-line notice (kept in the session), or JSON for the page's
script, with the status the control plane would have answered (409, 422 ... shown in the row).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from drawbridge.approval.channels import Channel
from drawbridge.control.catalogue_handlers import PINNING_OFF
from drawbridge.control.console.base import ConsoleBase
from drawbridge.control.console.sessions import Session
from drawbridge.control.inputs import MAX_NAME_CHARS, agent_glob, tool_glob
from drawbridge.control.problems import Problem, problem_for
from drawbridge.policy.edit import conditional_text
from drawbridge.state.approvals import ApprovalStatus

DECISIONS: Final = {"approve": ApprovalStatus.APPROVED, "deny": ApprovalStatus.DENIED}
MAX_REASON_CHARS: Final = 2000


def _field(
    request: Request, name: str, *, required: bool = True, limit: int = MAX_NAME_CHARS, strip: bool = True
) -> str:
    """A form field, checked; blanks around it dropped unless ``strip`` is false (a glob: refused with
    them, as the control plane refuses it, by the glob's own check)."""
    value = request.state.form.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise Problem(400, f"the form field {name!r} is required")
        return ""
    if not isinstance(value, str):
        raise Problem(400, f"the form field {name!r} must be text")
    if len(value) > limit:
        raise Problem(400, f"the form field {name!r} is longer than {limit} characters")
    return value.strip() if strip else value


class ActionHandlers(ConsoleBase):
    """The console's POST handlers (``app.Console``)."""

    async def set_action(self, request: Request, session: Session) -> Response:
        """A tool's action for one agent, exactly as ``PUT /policies/{agent}/tools/{tool}``."""
        agent, tool, action = _field(request, "agent"), _field(request, "tool"), _field(request, "action")
        back = "/console/tools?" + urlencode({"agent": agent})
        if _field(request, "shown_agent") != agent:
            # The row's form names another agent than the page it was used on names: refuse, lest a
            # change meant for the agent shown lands in another's policy.
            return self.answer(
                request, back, f"409: this row sets {agent!r}'s policy but the page shows another agent; reload the page",
                409,
            )
        try:
            result = await self.plane.policy_edit(agent, tool, action, session.operator)
        except Exception as exc:  # noqa: BLE001 -- refusals are shown in the row
            problem = problem_for(exc) or Problem(500, f"internal error ({type(exc).__name__})")
            return self.answer(request, back, f"{problem.status}: {problem.message}", problem.status)
        message = (
            f"{tool}: {result['action_before']} -> {result['action_after']} for {agent}"
            f" ({result['source_file']}, "
            + ("its rule removed)" if result["rule_index"] is None else f"rule {result['rule_index']})")
            if result["changed"]
            else f"{tool}: unchanged ({result['action_after']}) for {agent}"
        )
        conditional = conditional_text(result.get("after"))
        if conditional is not None:
            message += f"; before that: {conditional}"
        return self.answer(request, back, message)

    async def resolve(self, request: Request, session: Session) -> Response:
        """Approve or deny one approval, as the logged-in operator, through the engine."""
        decision = DECISIONS.get(request.path_params["decision"])
        if decision is None:
            raise Problem(404, "expected /console/approvals/{id}/approve or /deny")
        reason = _field(request, "reason", required=False, limit=MAX_REASON_CHARS)
        back = _field(request, "back", required=False) or "/console/approvals"
        if not back.startswith("/console/"):
            back = "/console/approvals"
        approval = await self.services.approvals.resolve(
            request.path_params["id"], decision, session.operator, Channel.CONSOLE, reason
        )
        return self.answer(request, back, f"{approval.tool} for {approval.agent}: {approval.status}")

    async def accept_pins(self, request: Request, session: Session) -> Response:
        """Accept the current definitions of one server's tools (or prompts: ``kind``), or of those named."""
        server = _field(request, "server", required=False)
        tools = [t for t in request.state.form.getlist("tool") if isinstance(t, str) and t]
        if bool(server) == bool(tools):
            raise Problem(400, "accept either one server or some tools")
        kind = _field(request, "kind", required=False) or "tool"
        if kind not in PINNING_OFF:
            raise Problem(400, "kind is tool or prompt")
        service = self.plane.pin_service(kind)
        groups: dict[str, Any]
        if server:
            if server not in service.servers():
                raise Problem(404, f"no upstream server named {server!r}")
            groups = {server: None}
        else:
            groups = await self.plane.group_tools(service, tools, kind)
        shown = _shown_fingerprints(request.state.form.getlist("fingerprint"))
        reviewed = await self.plane.reviewed_fingerprints(service, shown, groups, kind)
        accepted = await self.plane.accept_pin_groups(groups, session.operator, reviewed, kind)
        names = ", ".join(a["name"] for a in accepted) or "nothing new"
        return self.answer(request, "/console/pins", f"accepted: {names}")

    async def create_grant(self, request: Request, session: Session) -> Response:
        agent = agent_glob(_field(request, "agent", strip=False), "agent")
        tools = tool_glob(_field(request, "tools", strip=False), "tools")
        duration = _field(request, "duration")
        service = self.services.approvals.grant_service
        try:
            grant = await service.create(agent=agent, tools=tools, duration=duration, granted_by=session.operator)
        except ValueError as exc:
            raise problem_for(exc) or Problem(422, str(exc)) from None
        return self.answer(request, "/console/grants", f"grant {grant.id[:8]}: {tools} for {agent}, {duration}")

    async def revoke_grant(self, request: Request, session: Session) -> Response:
        grant = await self.services.approvals.grant_service.revoke(request.path_params["id"], revoked_by=session.operator)
        return self.answer(request, "/console/grants", f"grant {grant.id[:8]} revoked")


def _shown_fingerprints(values: list[Any]) -> dict[str, str]:
    """The ``fingerprint`` fields of a pins form (``TOOL=sha256:...``, one per tool the page showed):
    the console accepts only what it showed, so a form without them is refused."""
    shown: dict[str, str] = {}
    for value in values:
        name, sep, fingerprint = value.rpartition("=") if isinstance(value, str) else ("", "", "")
        if not sep or not name:
            raise Problem(400, "a fingerprint field is not TOOL=sha256:<hex>; reload the pins page")
        shown[name] = fingerprint
    if not shown:
        raise Problem(400, "the form names no fingerprint it showed; reload the pins page and accept from there")
    return shown


__all__ = ["ActionHandlers"]
