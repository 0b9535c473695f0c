"""The console's pages: what an operator reads before deciding (tools and their verdicts, approvals,
pins, grants, evidence, an overview).

Invariant: a page shows what the control plane's JSON routes show, read through the same handlers
(``ControlPlane.decision_rows``, ``approval_detail``, the pin service, the grant service), so the
console can never tell a person something the gateway does not decide. Arguments of a pending call
are shown only as ``approval.shown_arguments`` made them (secret-like values masked, long values
cut); the trace is read from the file the gateway appends to, never copied, and always whole: each
view streams it line by line (memory bounded by a line, never the file) through the chain's
verifier in a worker thread, so the verdict is the whole chain's and the entries shown are the
newest, whatever the file's size. A tool's description is never cut out of reach: past
``DESCRIPTION_SHOWN`` characters the whole text is in the row's expander.

Theory of operation. ``PageHandlers`` is a part of ``app.Console``; each handler gathers its
values and renders one template. Filters come from the query string and are applied here; unknown
filter values simply match nothing.
"""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, Final

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from drawbridge.canonical.text import UNSAFE_CATEGORIES
from drawbridge.config_reader import AGENT_ID
from drawbridge.control.console.base import ConsoleBase
from drawbridge.control.console.sessions import Session
from drawbridge.control.inputs import decision_agent
from drawbridge.control.services import HeldBackTool, current_catalogue
from drawbridge.control.views import approval_view, grant_view, tool_view
from drawbridge.evidence.bundle import record_hash
from drawbridge.evidence.chain import ChainReport, verify_chain
from drawbridge.evidence.truth.carrier import SCHEMA as CARRIER_SCHEMA
from drawbridge.evidence.vocabulary import SURFACE_SCHEMA

ACTIONS: Final = ("allow", "deny", "human_approval", "inherit")
PENDING_SHOWN: Final = 20
HISTORY_SHOWN: Final = 50
EVIDENCE_SHOWN: Final = 200
ENTRY_SHOWN: Final = ("seq", "at", "kind")
BODY_SHOWN: Final = ("agent", "tool", "action", "outcome", "evidence")
DESCRIPTION_SHOWN: Final = 240
"""Characters of a tool's description shown in its row; the whole text is one click away."""
SURFACE_SHOWN: Final = 1000
SURFACE_READ_BYTES: Final = 4 * 1024 * 1024
DIFF_CONTEXT: Final = 3
"""Unchanged lines shown either side of a change in a definition's diff."""


class PageHandlers(ConsoleBase):
    """The console's GET pages (``app.Console``)."""

    async def overview(self, request: Request, session: Session) -> Response:
        items = await current_catalogue(self.services.catalogue)
        servers = Counter(item.server for item in items)
        held = Counter(item.server for item in items if item.pin_status is not None and item.pin_status.value != "pinned")
        pending = await self.services.approvals.store.list("pending", limit=None)
        since = self.services.clock() - timedelta(hours=1)
        counted = Counter[str]()

        def count(entry: dict[str, Any]) -> None:
            if entry.get("kind") == "tool_decision" and _after(entry.get("at"), since):
                counted["calls"] += 1
                body = entry.get("body")
                if not isinstance(body, dict) or body.get("action") != "allow":
                    counted["refused"] += 1

        trace = await anyio.to_thread.run_sync(_read_trace, self.trace_path, count)
        states = dict(self.services.upstreams()) if self.services.upstreams is not None else {}
        names = sorted(set(servers) | set(states))
        return self.render(
            request, "overview.html", session,
            servers=[
                {"name": n, "tools": servers.get(n, 0), "held": held.get(n, 0), "down": states.get(n)} for n in names
            ],
            pending=len(pending), calls=counted["calls"], refused=counted["refused"], trace=trace,
        )

    async def tools_page(self, request: Request, session: Session) -> Response:
        query = request.query_params
        agents = _agents(self)
        asked = query.get("agent")
        # The agent check of GET /tools/decisions: a policy's glob or any other text names no agent.
        agent = decision_agent(asked) if asked else (agents[0] if agents else "")
        if agent and agent not in agents:
            agents.append(agent)
        items = {item.name: item for item in await current_catalogue(self.services.catalogue)}
        rows = await self.plane.decision_rows(agent) if agent else []
        family, access, search = query.get("family", ""), query.get("access", ""), query.get("q", "").strip().lower()
        review = query.get("review") == "1"
        one = query.get("tool")  # one tool's row, whatever the filters: the page's script refreshes it
        shown = []
        for row in rows:
            item = items.get(row["name"])
            tool = tool_view(item) if item is not None else {}
            if one is not None:
                if row["name"] == one:
                    shown.append({"row": row, "tool": tool, "edit": _edit_state(row, agent),
                                  "description": _description_view(tool.get("description"), "")})
                continue
            classification = row.get("classification") or {}
            if family and classification.get("family") != family:
                continue
            if access and classification.get("access") != access:
                continue
            if review and not row.get("to_review"):
                continue
            text = f"{row['name']} {tool.get('description') or ''}".lower()
            if search and search not in text:
                continue
            shown.append({"row": row, "tool": tool, "edit": _edit_state(row, agent),
                          "description": _description_view(tool.get("description"), search)})
        families = sorted({(r.get("classification") or {}).get("family") or "" for r in rows} - {""})
        accesses = sorted({(r.get("classification") or {}).get("access") or "" for r in rows} - {""})
        return self.render(
            request, "tools.html", session, agents=agents, agent=agent, rows=shown, total=len(rows),
            families=families, accesses=accesses, family=family, access=access, q=query.get("q", ""),
            review=review, actions=ACTIONS,
        )

    async def approvals_page(self, request: Request, session: Session) -> Response:
        pending = await _pending(self)
        resolved = [
            approval_view(a, self.services.clock())
            for a in await self.services.approvals.store.list(None, limit=HISTORY_SHOWN + PENDING_SHOWN)
            if not a.pending
        ][:HISTORY_SHOWN]
        return self.render(request, "approvals.html", session, history=resolved, **pending)

    async def pending_fragment(self, request: Request, session: Session) -> Response:
        """The pending approvals alone, for the page's script to poll (every 2 s)."""
        return self.render(request, "pending.html", session, **await _pending(self))

    async def approval_page(self, request: Request, session: Session) -> Response:
        detail = await self.plane.approval_detail(request.path_params["id"])
        return self.render(request, "approval.html", session, approval=detail)

    async def pins_page(self, request: Request, session: Session) -> Response:
        if self.services.pins is None and self.services.prompt_pins is None:
            return self.render(request, "pins.html", session, enabled=False, held=[], servers=[])
        items = {item.name: item for item in await current_catalogue(self.services.catalogue)}
        held = []
        for tool in await self.plane.held_back():
            if tool.current_fingerprint is None:
                continue  # offered as nothing an accept can pin (pins list shows it, with the reason)
            item = items.get(tool.name) if tool.kind == "tool" else None
            held.append(_held_view(tool, None if item is None else tool_view(item)))
        servers = sorted({(h["server"], h["kind"]) for h in held})
        return self.render(request, "pins.html", session, enabled=True, held=held, servers=servers)

    async def grants_page(self, request: Request, session: Session) -> Response:
        service = self.services.approvals.grant_service
        now = self.services.clock()
        listed = [grant_view(g, now) for g in await service.list(active_only=False)]
        active = [g for g in listed if g["active"]]
        ended = [g for g in listed if not g["active"]][-HISTORY_SHOWN:]
        return self.render(request, "grants.html", session, active=active, ended=ended)

    async def evidence_page(self, request: Request, session: Session) -> Response:
        query = request.query_params
        wanted = {k: query.get(k, "").strip() for k in ("agent", "tool", "action", "outcome")}
        latest: deque[tuple[dict[str, Any], dict[str, Any]]] = deque(maxlen=EVIDENCE_SHOWN)

        def keep(entry: dict[str, Any]) -> None:
            body = entry.get("body") if isinstance(entry.get("body"), dict) else {}
            if not any(v and str(body.get(k)) != v for k, v in wanted.items()):
                # Only the fields the page shows: the entries kept stay small whatever a body holds.
                latest.append(({k: entry.get(k) for k in ENTRY_SHOWN}, {k: body.get(k) for k in BODY_SHOWN}))

        trace = await anyio.to_thread.run_sync(_read_trace, self.trace_path, keep)
        surfaces = await anyio.to_thread.run_sync(_read_records, self.surface_path, SURFACE_SCHEMA, _surface_says)
        carriers = await anyio.to_thread.run_sync(_read_records, self.truth_path, CARRIER_SCHEMA, _carrier_says)
        read = {SURFACE_SCHEMA: (self.surface_path, surfaces), CARRIER_SCHEMA: (self.truth_path, carriers)}
        shown = [
            {"entry": entry, "body": body,
             "evidence": [_record_view(r, read) for r in body.get("evidence") or [] if isinstance(r, dict)]}
            for entry, body in reversed(latest)
        ]
        return self.render(request, "evidence.html", session, trace=trace, entries=shown, wanted=wanted)


# ------------------------------------------------------------------------------------ helpers


def _agents(console: ConsoleBase) -> list[str]:
    """The agents the policies are written for, most specific first (as evaluated): those a decision
    table can be made for (an agent id, or ``*``), as ``GET /tools/decisions`` accepts them; a policy
    for a glob such as ``bot-*`` names no one agent."""
    seen: list[str] = []
    for policy in console.services.policy_store.current.policies:
        text = policy.agent.text
        if text not in seen and (text == "*" or AGENT_ID.fullmatch(text)):
            seen.append(text)
    return seen


def _description_view(text: str | None, search: str) -> dict[str, Any] | None:
    """A tool's description as the Tools page lays it out: its first ``DESCRIPTION_SHOWN`` characters,
    and when it is longer the whole text in an expander, open when the search matches it, so that no
    word of it (an instruction after harmless text) is out of a person's reach."""
    if not text:
        return None
    long = len(text) > DESCRIPTION_SHOWN
    return {
        "short": text[:DESCRIPTION_SHOWN] if long else text,
        "whole": text if long else None,
        "open": long and bool(search) and search in text.lower(),
    }


def _edit_state(row: dict[str, Any], agent: str) -> str:
    """What the row's selector shows as chosen: the console's own rule for this tool, else inherit."""
    action = row.get("policy_action")
    return action if action in ACTIONS and row.get("rule") is not None else "inherit"


async def _pending(console: ConsoleBase) -> dict[str, Any]:
    """The newest pending approvals in detail (``PENDING_SHOWN``), and the ids of all pending ones: the
    page's script reads a card missing from the list it shows as ended, never one merely cut off."""
    listed = await console.services.approvals.store.list("pending", limit=None)
    shown = [await console.plane.approval_detail(a.id) for a in listed[:PENDING_SHOWN]]
    return {"pending": shown, "pending_ids": [a.id for a in listed]}


def _diff(pinned: str, current: str) -> list[tuple[str, str]]:
    """A line diff of two texts as ``(kind, line)``: ``-`` pinned only, ``+`` current only. Lines end at
    line feeds only: a line or paragraph separator stays in its line, where it is shown escaped."""
    out: list[tuple[str, str]] = []
    for line in difflib.ndiff(pinned.split("\n"), current.split("\n")):
        if line.startswith(("- ", "+ ", "  ")):
            out.append((line[0], line[2:]))
    return out


def _seen(line: str) -> str:
    """A line as a person would read it unescaped: without its control and format characters."""
    return "".join(c for c in line if unicodedata.category(c) not in UNSAFE_CATEGORIES)


def _marked(lines: list[tuple[str, str]]) -> list[tuple[str, str, bool]]:
    """Each diff line with whether it differs from a line of the other side only in control or format
    characters (tag characters, bidi overrides, zero-width ones): unescaped, the two would look the same."""
    other: dict[str, dict[str, set[str]]] = {"-": {}, "+": {}}
    for kind, line in lines:
        if kind in other:
            other[kind].setdefault(_seen(line), set()).add(line)
    opposite = {"-": "+", "+": "-"}
    return [
        (kind, line, kind in opposite and any(raw != line for raw in other[opposite[kind]].get(_seen(line), ())))
        for kind, line in lines
    ]


DEFINITION_PARTS: Final = (("description", "Description"), ("inputSchema", "Input schema"),
                            ("outputSchema", "Output schema"), ("annotations", "Annotations"), ("title", "Title"),
                            ("arguments", "Arguments"))
"""The parts of a pinned definition the pins page sets side by side (a prompt's: its arguments too)."""


def _folded(lines: list[tuple[str, str]], context: int = DIFF_CONTEXT) -> list[tuple[str, str]]:
    """A diff with each run of unchanged lines farther than ``context`` from a change cut to ``…``:
    a whole definition is mostly schema that did not change."""
    changed = [i for i, (kind, _line) in enumerate(lines) if kind != " "]
    keep = {j for i in changed for j in range(i - context, i + context + 1)}
    out: list[tuple[str, str]] = []
    for i, line in enumerate(lines):
        if i in keep:
            out.append(line)
        elif not out or out[-1] != (" ", "…"):
            out.append((" ", "…"))
    return out


def _held_view(tool: HeldBackTool, served: dict[str, Any] | None) -> dict[str, Any]:
    """A held-back tool as the pins page sets it out: each side's definition part by part, and a
    line diff of the whole definitions (of the descriptions alone when the pinned one predates
    schema version 5). The current side is what the pin store observed (what an accept pins), else
    what the catalogue serves now."""
    view = tool.as_dict()
    pinned, current = _parsed(tool.pinned_definition), _parsed(tool.current_definition)
    if current is None and served is not None:
        current = {"title": served.get("title"), "description": served.get("description"),
                   "inputSchema": served.get("input_schema"), "annotations": served.get("annotations")}
    view["sides"] = [{"key": key, "label": label, "pinned": _shown(pinned, key), "current": _shown(current, key)}
                     for key, label in DEFINITION_PARTS]
    view["pinned_whole"] = pinned is not None
    if pinned is not None and current is not None:
        view["diff_of"] = "definition"
        view["diff"] = _marked(_folded(_diff(_pretty(pinned), _pretty(current))))
    else:
        view["diff_of"] = "description"
        view["diff"] = _marked(_diff(tool.pinned_description or "", tool.current_description or ""))
    view["hidden_only"] = sum(1 for _kind, _line, hidden in view["diff"] if hidden)
    return view


def _parsed(definition: str | None) -> dict[str, Any] | None:
    """A stored definition (JCS text) as an object, or None when it is not known."""
    try:
        parsed = json.loads(definition) if definition is not None else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _shown(definition: dict[str, Any] | None, key: str) -> str | None:
    """One part of a definition as text (a JSON value indented), None when absent or unknown."""
    value = None if definition is None else definition.get(key)
    return value if isinstance(value, str) or value is None else _pretty(value)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _after(at: object, since: datetime) -> bool:
    if not isinstance(at, str):
        return False
    try:
        when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        return when.tzinfo is not None and when >= since
    except ValueError:
        return False


@dataclass(frozen=True)
class Said:
    """What one evidence record asserts, as a line, and (a truth carrier) its verdict alone."""

    text: str
    verdict: str | None = None


class TraceView:
    """The trace as a page shows it: whether (and up to where) the whole chain verifies, and what the
    page asked to keep of its entries (``_read_trace``)."""

    def __init__(self, path: Path | None, report: ChainReport | None = None, problem: str | None = None) -> None:
        self.path = path
        self.ok = report.ok if report is not None and problem is None else None
        self.verified = report.entries if report is not None else 0
        self.head_seq = report.head.seq if report is not None and report.head is not None else None
        first = report.first_problem if report is not None else None
        self.problem = problem or (None if first is None else f"line {first.line}: {first.message}")


def _record_view(record: dict[str, Any], read: dict[str, tuple[Path | None, dict[str, Said]]]) -> dict[str, Any]:
    """A record the trace entry names, with what its file's record of that content hash asserts;
    ``missing`` when the gateway writes that file and none of its latest records has the hash (not
    written yet, older than what is read, or changed since it was written)."""
    path, found = read.get(record.get("type"), (None, {}))
    said = found.get(record.get("content_hash"))
    return {**record, "says": said, "missing": path is not None and said is None}


def _surface_says(record: dict[str, Any]) -> Said | None:
    """A surface record's effect, rule, status and side-effect level."""
    try:
        (decision,) = record["observed_tool_decisions"]
    except (KeyError, TypeError, ValueError):
        return None
    effect, response = decision.get("decision") or {}, decision.get("response") or {}
    level = (response.get("side_effect") or {}).get("level")
    return Said(f"{effect.get('effect')} by {effect.get('rule_id') or 'no rule'}; "
                f"{response.get('status')}; side effect {level}")


def _carrier_says(record: dict[str, Any]) -> Said | None:
    """A truth carrier's verdict on the call against the agent's declared contract, and its identity state."""
    if "decision_verdict" not in record:
        return None
    verdict = record.get("decision_verdict") or "unclassified"
    return Said(f"verdict {verdict}; tool {record.get('identity_state')} in the list; order {record.get('order')}",
                str(verdict))


def _read_records(path: Path | None, schema: str, says: Callable[[dict[str, Any]], Said | None]) -> dict[str, Said]:
    """The latest records of one file (``SURFACE_SHOWN``), by the content hash the trace names them with:
    each as what it asserts."""
    if path is None:
        return {}
    try:
        with path.open("rb") as handle:
            handle.seek(max(handle.seek(0, 2) - SURFACE_READ_BYTES, 0))
            lines = handle.read().splitlines()[-SURFACE_SHOWN:]
    except OSError:
        return {}
    out: dict[str, Said] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a partial first line
        said = says(record) if isinstance(record, dict) else None
        digest = record_hash(schema, record) if said is not None else None
        if said is not None and digest is not None:
            out[digest] = said
    return out


def _read_trace(path: Path | None, see: Callable[[dict[str, Any]], None]) -> TraceView:
    """Verify the whole trace chain, streaming it line by line (memory bounded by one line, whatever the
    file's size), and hand every entry, oldest first, to ``see``: a page keeps what it shows (the
    latest entries, a count over the last hour) and never stops short of the newest entry. A last line
    still being written (no line feed yet) is left for the next view. Runs in a worker thread: it is
    as slow as ``drawbridge evidence verify-chain`` on the same file."""
    if path is None:
        return TraceView(None, problem="this gateway writes no trace (no evidence directory)")
    try:
        with path.open("rb") as handle:
            lines = _whole_lines(handle, see)
            report = verify_chain(lines)
            for _rest in lines:  # past a problem: the entries are still shown, newest included
                pass
    except OSError as exc:
        return TraceView(path, problem=f"the trace cannot be read ({exc.strerror})")
    if report.entries == 0 and report.ok:
        return TraceView(path, problem="the trace holds no entry yet")
    return TraceView(path, report)


def _whole_lines(handle: BinaryIO, see: Callable[[dict[str, Any]], None]) -> Iterator[bytes]:
    """The file's complete lines (split at line feeds only, as the verifier reads them), each parsed
    entry handed to ``see`` on the way."""
    for line in handle:
        if not line.endswith(b"\n"):
            return
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if isinstance(value, dict):
            see(value)
        yield line


__all__ = ["ACTIONS", "PageHandlers", "TraceView"]
