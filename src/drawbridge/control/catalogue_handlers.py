"""The control plane's catalogue and the policy over it: served tools, decisions, pins, policies.

Invariant: a change made here is in the trace chain, or not left in force where it can be undone.
A policy edit is recorded as ``mesh.policy_edit``; should the record fail, the edited file is put
back from its ``.bak`` and the policies reloaded, and the answer (500) says whether that worked. A
pin acceptance is recorded as ``mesh.pin_accept``, each tool's on its own; should a record fail,
the answer (500) names the server whose pins were accepted unrecorded. What is shown of a tool is
what its upstream declared (``views.tool_view``), never the gateway's configuration.

Theory of operation. ``CatalogueHandlers`` is a part of ``routes.ControlPlane``: each handler reads
its input (``inputs``), calls one service (``ControlServices``: the catalogue, the policy store,
the pin service), records what changed and renders the result. Policy edit paths are read from the
raw request path, so an agent or tool name holding ``/`` can be sent percent-encoded
(``/policies/team%2Fbot/tools/fs.read``). A pin acceptance names a server or a list of tools; the
tools are all resolved (served names, or pinned ones no longer served) before anything changes.
With ``fingerprints`` (what ``GET /tools/pins`` showed the person) it pins only those definitions:
should the server offer anything else now, or a tool change that no fingerprint names, nothing is
accepted (409), so a change made between reviewing and accepting is never pinned unseen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from drawbridge.canonical import is_sha256_digest
from drawbridge.catalogue.decisions import decision_table
from drawbridge.control.inputs import (
    MAX_NAME_CHARS,
    caller,
    check_keys,
    decision_agent,
    json_body,
    person,
    query_param,
    shown,
    text_field,
)
from drawbridge.control.problems import Problem, error_response
from drawbridge.control.services import PIN_ACCEPT_KIND, ControlServices, current_catalogue
from drawbridge.control.views import policy_view, tool_view
from drawbridge.policy.edit import EditRefused, tool_refusal
from drawbridge.policy.model import Action, PolicySet
from drawbridge.state.policy_edits import (
    BACKUP_SUFFIX,
    POLICY_EDIT_KIND,
    EditApplied,
    apply_policy_edit_async,
    atomic_write,
    edit_lock,
)
from drawbridge.state.policy_store import PolicyStore
from drawbridge.state.errors import StateUnavailable

logger = logging.getLogger("drawbridge.control")

_POLICIES_PREFIX: Final = "/policies/"
_SET_ACTIONS: Final = frozenset(a.value for a in Action)
PINNING_OFF: Final = {
    "tool": "tool pinning is off (pin_tools: false): no tool is held back",
    "prompt": "prompt pinning is off (pin_prompts: false): no prompt is held back",
}


def _seq(entry: Any) -> int | None:
    return entry.get("seq") if isinstance(entry, Mapping) else None


class CatalogueHandlers:
    """The handlers of ``/tools`` and ``/policies``, on the ``ControlServices`` of the plane."""

    services: ControlServices

    # -- catalogue and decisions ------------------------------------------------------------------

    async def tools(self, request: Request) -> Response:
        """``GET /tools``: every served tool with its classification."""
        items = await current_catalogue(self.services.catalogue)
        return JSONResponse([tool_view(item) for item in items])

    async def decisions(self, request: Request) -> Response:
        """``GET /tools/decisions?agent=ID``: what the policy decides per tool for one agent."""
        agent = decision_agent(query_param(request, "agent"))
        return JSONResponse(await self.decision_rows(agent))

    async def decision_rows(self, agent: str) -> list[dict[str, Any]]:
        """One row per served tool: what the policy in force decides for ``agent`` (also the console's)."""
        items = await current_catalogue(self.services.catalogue)
        policy_set = self.services.policy_store.current
        rows = decision_table(policy_set, agent, [item.catalogue_tool() for item in items])
        out = []
        for item, row in zip(items, rows, strict=True):
            view = row.as_dict()
            view["server"] = item.server
            out.append(view)
        return out

    # -- policies ---------------------------------------------------------------------------------

    async def policies(self, request: Request) -> Response:
        """``GET /policies``: the policies in force, in evaluation order."""
        policy_set: PolicySet = self.services.policy_store.current
        return JSONResponse([policy_view(p) for p in policy_set.policies])

    async def edit_policy(self, request: Request) -> Response:
        """``PUT /policies/{agent}/tools/{tool}`` with ``{"action": ..., "by": ...}`` (and
        ``"unserved": true`` to write a rule for a tool the gateway does not serve yet)."""
        agent, tool = _edit_target(request)
        body = await json_body(request, self.services.read_json)
        check_keys(body, ("action", "by", "unserved"))
        action = text_field(body, "action", required=True)
        by = person(text_field(body, "by", required=True), "by")
        unserved = body.get("unserved", False)
        if not isinstance(unserved, bool):
            raise Problem(400, "field 'unserved' must be true or false")
        assert action is not None and by is not None
        return JSONResponse(await self.policy_edit(agent, tool, action, by, unserved=unserved))

    async def policy_edit(
        self, agent: str, tool: str, action: str, by: str, *, unserved: bool = False
    ) -> dict[str, Any]:
        """The per-tool edit of ``PUT /policies`` (also the console's): applied, reloaded, recorded;
        a refusal is a ``Problem`` and leaves the file as it was.

        A rule is written only for a tool the gateway serves, unless ``unserved`` says it is meant
        for one not served (yet): a typo would otherwise become a rule nothing ever calls, reported
        as done. ``inherit`` only removes rules, so it is taken for any name."""
        if action in _SET_ACTIONS:  # a name that can never be written is told so first (400, not 404)
            refused = tool_refusal(tool, Action(action))
            if refused is not None:
                raise Problem(refused.status, refused.message)
        if action in _SET_ACTIONS and not unserved:
            served = {item.name for item in await current_catalogue(self.services.catalogue)}
            if tool not in served and tool.isprintable():
                raise Problem(
                    404,
                    f"the gateway serves no tool named {shown(tool)}; to write a rule for a tool it "
                    'does not serve yet, send "unserved": true (drawbridge policy set --unserved)',
                )
        store = self.services.policy_store
        result = await apply_policy_edit_async(store, agent=agent, tool=tool, action=action, by=by)
        if isinstance(result, EditRefused):
            raise Problem(result.status, result.message)
        try:
            entry = await self.services.trace_append(POLICY_EDIT_KIND, result.trace_body())
        except Exception as exc:  # noqa: BLE001 -- an unrecorded edit must not stay in force
            logger.error("policy edit could not be recorded (%s); undoing it", type(exc).__name__)
            undone = await anyio.to_thread.run_sync(_undo_edit, store, result)
            raise Problem(
                500,
                "the edit could not be recorded in the trace chain, so "
                + ("it was undone" if undone is None else f"it was to be undone, but {undone}"),
            ) from None
        view = result.trace_body()
        view.update(
            generation=result.generation,
            backup=None if result.backup is None else result.backup.name,
            trace_seq=_seq(entry),
        )
        return view

    # -- pins -------------------------------------------------------------------------------------

    def pin_service(self, kind: str = "tool") -> Any:
        service = self.services.prompt_pins if kind == "prompt" else self.services.pins
        if service is None:
            raise Problem(409, PINNING_OFF[kind])
        return service

    def pin_kinds(self) -> list[str]:
        """The kinds pinned here (``tool``, ``prompt``); 409 when neither is (also the console's)."""
        kinds = [kind for kind, on in (("tool", self.services.pins), ("prompt", self.services.prompt_pins)) if on]
        if not kinds:
            raise Problem(409, PINNING_OFF["tool"])
        return kinds

    async def held_back(self, kind: str | None = None) -> list[Any]:
        """Every held-back tool and prompt, tools first, or those of ``kind`` (also the console's).

        Pins of one kind that cannot be read refuse the listing (503: an empty list would read as
        "nothing held back"), naming that kind, and how the other kind can still be listed alone."""
        kinds = self.pin_kinds() if kind is None else [kind]
        items: list[Any] = []
        for each in kinds:
            try:
                items += await self.pin_service(each).held_back()
            except StateUnavailable as exc:
                others = [k for k in kinds if k != each]
                alone = "".join(
                    f"; the {k}s can still be listed alone (GET /tools/pins?kind={k}, drawbridge pins list --kind {k})"
                    for k in others
                )
                raise Problem(503, f"{exc}{alone}") from None
        return items

    async def pins(self, request: Request) -> Response:
        """``GET /tools/pins`` (``?kind=tool|prompt`` for one kind): held-back tools (and prompts) with
        the pinned and the current description."""
        kind = query_param(request, "kind")
        if kind is not None and kind not in PINNING_OFF:
            raise Problem(400, 'query parameter "kind" must be "tool" or "prompt"')
        return JSONResponse([item.as_dict() for item in await self.held_back(kind)])

    async def accept_pins(self, request: Request) -> Response:
        """``POST /tools/pins/accept`` with ``{"server": S}`` or ``{"tools": [...]}`` (and ``by``), and
        ``fingerprints`` (tool -> reviewed fingerprint) to accept only what was reviewed. ``kind``
        (``tool``, the default, or ``prompt``) says what the names and fingerprints are; a ``server``
        alone, without ``kind`` or ``fingerprints``, accepts both its tools and its prompts."""
        body = await json_body(request, self.services.read_json)
        check_keys(body, ("server", "tools", "fingerprints", "by", "kind", "dry_run"))
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise Problem(400, "field 'dry_run' must be true or false")
        kind = body.get("kind")
        if kind is not None and kind not in PINNING_OFF:
            raise Problem(400, 'field "kind" must be "tool" or "prompt"')
        server = text_field(body, "server", required=False)
        tools = body.get("tools")
        by = person(text_field(body, "by", required=False), "by") or caller(request)
        if (server is None) == (tools is None):
            raise Problem(400, 'give either "server" or "tools", not both and not neither')
        every = server is not None and kind is None and body.get("fingerprints") is None
        kinds = self.pin_kinds() if every else [kind or "tool"]
        accepted: list[dict[str, Any]] = []
        for each in kinds:
            service = self.pin_service(each)
            if server is not None:
                if not server.strip():
                    raise Problem(400, "field 'server' must not be empty")
                if server not in service.servers():
                    if every and each == "prompt":
                        continue  # an upstream with no prompts of its own (OpenAPI, CLI)
                    raise Problem(404, f"no upstream server named {shown(server)}")
                groups: dict[str, list[str] | None] = {server: None}
            else:
                if not isinstance(tools, list) or not tools or not all(isinstance(t, str) and t for t in tools):
                    raise Problem(400, f'field "tools" must be a non-empty list of {each} names')
                groups = dict(await self.group_tools(service, tools, each))
            reviewed = await self.reviewed_fingerprints(service, body.get("fingerprints"), groups, each)
            accepted += await self.accept_pin_groups(groups, by, reviewed, each, dry_run=dry_run)
        return JSONResponse({"accepted": accepted, "count": len(accepted), **({"dry_run": True} if dry_run else {})})

    async def reviewed_fingerprints(
        self, service: Any, value: Any, groups: Mapping[str, Sequence[str] | None], kind: str = "tool"
    ) -> dict[str, dict[str, str | None]] | None:
        """``fingerprints`` (agent-visible name -> ``sha256:...``, or null for a tool reviewed as
        removed) by server and upstream name; None when absent (the current definitions are pinned).
        Every server accepted is bound, so a tool that would change unnamed is refused (409)."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or not value:
            raise Problem(400, 'field "fingerprints" must be a non-empty object of tool name -> fingerprint')
        for name, fingerprint in value.items():
            if fingerprint is not None and not is_sha256_digest(fingerprint):
                raise Problem(
                    400, f"fingerprint of {shown(name, 80)} must be sha256:<64 lowercase hex> or null (removed)"
                )
        reviewed: dict[str, dict[str, str | None]] = {name: {} for name in groups}
        for (server, upstream), fingerprint in zip(
            await self.resolve_tools(service, list(value), kind), value.values(), strict=True
        ):
            if server not in reviewed:
                raise Problem(400, f"a fingerprint names {shown(service.display_name(server, upstream), 80)}, "
                                   "which this acceptance does not accept")
            reviewed[server][upstream] = fingerprint
        return reviewed

    async def accept_pin_groups(
        self,
        groups: Mapping[str, Sequence[str] | None],
        by: str,
        reviewed: Mapping[str, Mapping[str, str | None]] | None = None,
        kind: str = "tool",
        *,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """Accept the current definitions (per server: ``None`` is all its tools, or prompts), each
        recorded as ``mesh.pin_accept`` (also the console's); with ``reviewed``, only if they are the
        reviewed ones. ``dry_run``: what would be accepted, checked the same way, neither pinned nor
        recorded (the CLI checks every kind of a reviewed listing before it accepts any)."""
        service = self.pin_service(kind)
        accepted: list[dict[str, Any]] = []
        for name, names in groups.items():
            bound = None if reviewed is None else reviewed.get(name, {})
            changes = await service.accept(name, names, by=by, reviewed=bound, dry_run=dry_run)
            for change in changes:
                record = change.record()
                record["name"] = service.display_name(change.server, change.name)
                if dry_run:
                    accepted.append(record)
                    continue
                try:
                    entry = await self.services.trace_append(PIN_ACCEPT_KIND, record)
                except Exception as exc:  # noqa: BLE001
                    logger.error("pin acceptance could not be recorded: %s", type(exc).__name__)
                    raise Problem(
                        500,
                        f"pins of server {shown(change.server)} were accepted but could not be recorded "
                        "in the trace chain; check the trace log",
                    ) from None
                record["trace_seq"] = _seq(entry)
                accepted.append(record)
        return accepted

    async def group_tools(self, service: Any, tools: list[str], kind: str = "tool") -> dict[str, list[str]]:
        """Agent-visible names -> upstream names, grouped by server; all resolved before any change (also
        the console's)."""
        groups: dict[str, list[str]] = {}
        for server, upstream in await self.resolve_tools(service, tools, kind):
            groups.setdefault(server, []).append(upstream)
        return groups

    async def resolve_tools(self, service: Any, tools: Sequence[str], kind: str = "tool") -> list[tuple[str, str]]:
        """``(server, upstream name)`` of each agent-visible name (served, or pinned and gone; a prompt's
        by its ``<server>.<prompt>`` name); 404 naming the unknown ones."""
        served = await current_catalogue(self.services.catalogue) if kind == "tool" else ()
        by_name = {item.name: item for item in served}
        servers = list(service.servers())
        resolved: list[tuple[str, str]] = []
        unknown: list[str] = []
        for name in tools:
            item = by_name.get(name)
            if item is not None:
                resolved.append((item.server, item.upstream_name))
                continue
            target = _split_known(name, servers, service)
            if target is None:
                unknown.append(name)
            else:
                resolved.append(target)
        if unknown:
            names = ", ".join(shown(n, 80) for n in unknown[:5])
            raise Problem(404, f"no served or pinned {kind} named {names}")
        return resolved


def _split_known(name: str, servers: Sequence[str], service: Any) -> tuple[str, str] | None:
    """``(server, upstream name)`` for a name no longer served (a pinned tool that went away)."""
    for server in servers:
        head, dot, upstream = name.partition(".")
        if dot and head == server and upstream and service.display_name(server, upstream) == name:
            return server, upstream
    return None


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
    """Put the edited file back from its ``.bak`` and reload; None when done, else what went wrong.
    Under the edit lock, so that no other process's edit lands between the check and the write."""
    path, backup = applied.path, applied.backup
    if path is None or backup is None:
        return None  # nothing was written
    with edit_lock(store) as refused:
        if refused is not None:
            return f"{refused.message}; its previous bytes are in {path.name}{BACKUP_SUFFIX}"
        return _undo_locked(store, applied, path, backup)


def _undo_locked(store: PolicyStore, applied: EditApplied, path: Path, backup: Path) -> str | None:
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


__all__ = ["CatalogueHandlers"]
