"""What changes when a message crosses the gateway: the per-hop parts, and nothing else.

Invariant: a message forwarded between an agent and an upstream keeps every field it carried except
these, which belong to one hop and are rewritten by the gateway:

* the JSON-RPC ``id`` (each side has its own id space; the router maps them);
* ``params.name`` of a namespaced tool or prompt (the ``server.`` prefix is removed upstream);
* ``params._meta.progressToken`` (tokens are chosen per connection; the gateway substitutes its own
  upstream and maps notifications back);
* ``params.task`` (2025-11-25 task augmentation): kept only on a handshake-era agent's ``tools/call``
  to an upstream that declared task-augmented tool calls (``protocol/tasks.py``; the call is decided
  first, like any call, and the upstream's task id is replaced by one of the gateway's on the way
  back); removed everywhere else, so such a call is decided, run and answered as one request. No
  Tasks extension is declared upstream for a 2026-07-28 agent, which gets its answer at once;
* the reserved envelope keys of ``_meta`` (``io.modelcontextprotocol/protocolVersion``, ``clientInfo``,
  ``clientCapabilities``, ``serverInfo``, ``logLevel``), which describe one connection and are removed
  when crossing, so a 2026-07-28 agent's envelope never reaches a handshake-era upstream; only what a
  2026-07-28 agent declares it can answer (elicitation, sampling, roots) goes on to a 2026-07-28
  upstream, as the ``clientCapabilities`` of that request, because the upstream's ``inputRequests``
  reach the agent unchanged and may only be of kinds it declared;
* log lines (``notifications/message``) of a handshake-era upstream reach a 2026-07-28 agent only on
  the request that asked for them (``io.modelcontextprotocol/logLevel``) and at or above that level
  (``log_line_wanted``; logging.mdx: never for a request without the key);
* on errors for a 2026-07-28 agent, the codes that era forbids (``modern_error``): ``-32002`` (resource
  not found before 2026) becomes ``-32602``, as the spec replaced it; ``-32042`` (URL elicitation
  required, 2025-11-25 only) and codes of ``-32020..-32099`` the spec does not define become
  ``-32603``, whose message names the upstream's code. So do the three it defines (``-32020`` header
  mismatch, ``-32021`` missing client capability, ``-32022`` unsupported version) when they speak of
  what the gateway wrote rather than of what the agent sent: passed on, they would read as the
  gateway refusing the agent's request (a client falls back to another version on a ``-32022``).
  Which ones the agent may get is ``relayed_codes``: under wrap all three (the agent's call reaches
  the server as it came); under serve, which writes its own envelope, version and headers, only
  ``-32021``, and only from a 2026-07-28 upstream, which is sent the capabilities the agent declared
  (``RELAYED_CLIENT_CAPABILITIES``); a handshake-era upstream has none of these codes in its era;
* on results for a 2026-07-28 agent: ``resultType`` is added when absent, and list and read results get
  ``ttlMs`` (the upstream's, or 0) and ``cacheScope: "private"``, because what the gateway serves can
  differ per agent and a shared cache must never hand one agent's answer to another; an interim
  ``InputRequiredResult`` carries no caching hints at all (caching.mdx: it is not cacheable).

Everything else (annotations, ``_meta`` keys of other namespaces, ``outputSchema``, ``title``, unknown
fields) is copied as parsed. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from drawbridge.gateway.protocol.eras import CLIENT_CAPABILITIES_META_KEY, RESERVED_PREFIX
from drawbridge.gateway.protocol.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from drawbridge.gateway.protocol.methods import (
    DISCOVER,
    PROMPTS_LIST,
    RESOURCE_TEMPLATES_LIST,
    RESOURCES_LIST,
    RESOURCES_READ,
    TOOLS_LIST,
)
from drawbridge.gateway.protocol.tasks import task_capability

PER_HOP_META_KEYS: Final = frozenset(
    RESERVED_PREFIX + key for key in ("protocolVersion", "clientInfo", "clientCapabilities", "serverInfo", "logLevel")
)
CACHEABLE_METHODS: Final = frozenset(
    {TOOLS_LIST, PROMPTS_LIST, RESOURCES_LIST, RESOURCE_TEMPLATES_LIST, RESOURCES_READ, DISCOVER}
)
PRIVATE: Final = "private"
RELAYED_CLIENT_CAPABILITIES: Final = frozenset({"elicitation", "sampling", "roots"})
"""What a 2026-07-28 agent declares that the gateway passes on: the kinds of ``inputRequests`` it can
answer, which the gateway relays to it unchanged."""

_KEEP: Final = object()


def valid_token(value: Any) -> bool:
    """Progress tokens (like request ids) are strings or integers; ``true`` is not an integer."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def progress_token(params: Any) -> str | int | None:
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    token = meta.get("progressToken") if isinstance(meta, Mapping) else None
    return token if valid_token(token) else None


LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""RFC 5424 severities, least severe first, as MCP names them."""
LOG_LEVEL_META_KEY: Final = RESERVED_PREFIX + "logLevel"


def log_line_wanted(request_params: Any, line_params: Any) -> bool:
    """Whether a log line may go to a 2026-07-28 agent on the request with ``request_params``: that
    request asked for logs (``logLevel``) and the line is at or above the level asked for."""
    meta = request_params.get("_meta") if isinstance(request_params, Mapping) else None
    asked = meta.get(LOG_LEVEL_META_KEY) if isinstance(meta, Mapping) else None
    level = line_params.get("level") if isinstance(line_params, Mapping) else None
    if asked not in LOG_LEVELS or level not in LOG_LEVELS:
        return False
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(asked)


RESOURCE_NOT_FOUND_2025: Final = -32002  # read, never answered
URL_ELICITATION_REQUIRED_2025: Final = -32042  # read, never answered
MCP_RESERVED_CODES: Final = range(-32099, -32019)  # read, never answered
MCP_DEFINED_CODES: Final = frozenset({-32020, -32021, -32022})
"""HeaderMismatch, MissingRequiredClientCapability, UnsupportedProtocolVersion: the only codes of the
reserved band -32020..-32099 that 2026-07-28 defines (basic/index.mdx, "Error Codes")."""


MISSING_CLIENT_CAPABILITY: Final = -32021


def relayed_codes(*, envelope: bool = False, capabilities: bool = False) -> frozenset[int]:
    """The codes 2026-07-28 defines that an upstream's error may carry to the agent (module
    docstring): all where the agent's own ``envelope`` reached it (wrap); ``-32021`` where only the
    ``capabilities`` the agent declared did (serve, to a 2026-07-28 upstream); none otherwise."""
    if envelope:
        return MCP_DEFINED_CODES
    return frozenset({MISSING_CLIENT_CAPABILITY}) if capabilities else frozenset()


def modern_error(error: Any, *, passed: frozenset[int] = frozenset()) -> Any:
    """An upstream's JSON-RPC ``error`` as a 2026-07-28 agent may receive it (module docstring);
    anything else is returned as it is. ``passed``: which of the codes 2026-07-28 defines speak of
    the agent's own request here (``relayed_codes``); the others become -32603."""
    if not isinstance(error, Mapping):
        return error
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return error
    if code == RESOURCE_NOT_FOUND_2025:
        return {**error, "code": INVALID_PARAMS}
    if code == URL_ELICITATION_REQUIRED_2025 or (code in MCP_RESERVED_CODES and code not in passed):
        said = error.get("message")
        why = "about the gateway's request to it, not this one" if code in MCP_DEFINED_CODES else (
            "which 2026-07-28 does not allow"
        )
        message = f"the upstream answered with JSON-RPC error {code}, {why}"
        return {**error, "code": INTERNAL_ERROR, "message": f"{message}: {said}" if isinstance(said, str) else message}
    return error


def strip_per_hop(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in meta.items() if key not in PER_HOP_META_KEYS}


def outbound_params(
    params: Mapping[str, Any] | None,
    *,
    name: Any = _KEEP,
    name_key: str = "name",
    progress: Any = _KEEP,
    task: bool = False,
    agent_capabilities: bool = False,
) -> dict[str, Any] | None:
    """The params to send on the next hop: a shallow copy with the per-hop parts rewritten.

    ``name`` replaces ``params[name_key]``; ``progress`` replaces an existing ``_meta.progressToken``;
    ``task`` keeps a task augmentation (the next hop runs it as a task). ``agent_capabilities`` (the
    next hop is a 2026-07-28 upstream) keeps what a 2026-07-28 agent's envelope declares it can
    answer (``RELAYED_CLIENT_CAPABILITIES``), so that the upstream sends it only ``inputRequests`` it
    declared; the rest of the envelope becomes the gateway's (``modern.with_envelope``). A ``_meta``
    left empty only because its envelope keys were removed is dropped.
    """
    if params is None:
        return None
    out = dict(params)
    if not task:
        out.pop("task", None)
    if name is not _KEEP:
        out[name_key] = name
    meta = params.get("_meta")
    if isinstance(meta, Mapping):
        new_meta = strip_per_hop(meta)
        if progress is not _KEEP and "progressToken" in new_meta:
            new_meta["progressToken"] = progress
        declared = meta.get(CLIENT_CAPABILITIES_META_KEY)
        if agent_capabilities and isinstance(declared, Mapping):
            new_meta[CLIENT_CAPABILITIES_META_KEY] = {
                key: value for key, value in declared.items() if key in RELAYED_CLIENT_CAPABILITIES
            }
        if new_meta or not meta:
            out["_meta"] = new_meta
        else:
            del out["_meta"]
    return out


def downstream_result(result: Any, *, method: str | None, modern: bool) -> Any:
    """An upstream result as the agent receives it (see the module docstring for what changes)."""
    if not isinstance(result, Mapping):
        return result
    out = dict(result)
    meta = out.get("_meta")
    if isinstance(meta, Mapping) and any(key in PER_HOP_META_KEYS for key in meta):
        stripped = strip_per_hop(meta)
        if stripped:
            out["_meta"] = stripped
        else:
            del out["_meta"]
    if modern:
        out.setdefault("resultType", "complete")
        if out["resultType"] == "input_required":  # interim: not cacheable, no hints (caching.mdx)
            out.pop("ttlMs", None)
            out.pop("cacheScope", None)
        elif method in CACHEABLE_METHODS:
            ttl = out.get("ttlMs")
            if not (isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0):
                out["ttlMs"] = 0
            out["cacheScope"] = PRIVATE
    return out


def gateway_result(result: Mapping[str, Any], *, method: str, modern: bool) -> dict[str, Any]:
    """A result the gateway composed itself, decorated for the agent's era."""
    out = dict(result)
    if modern:
        out.setdefault("resultType", "complete")
        if method in CACHEABLE_METHODS:
            out.setdefault("ttlMs", 0)
            out["cacheScope"] = PRIVATE
    return out


# ----------------------------------------------------------------------------------- capabilities


def _flag(caps: Sequence[Mapping[str, Any]], section: str, key: str) -> bool:
    return any(isinstance(c.get(section), Mapping) and c[section].get(key) is True for c in caps)


def union_capabilities(upstream_caps: Sequence[Mapping[str, Any]], *, tasks: bool = False) -> dict[str, Any]:
    """The server capabilities the gateway declares: what at least one upstream offers and it can route.

    ``tools.listChanged`` is always true (the gateway's catalogue changes when an upstream reconnects).
    ``tasks`` (task-augmented tool calls only, ``protocol/tasks.py``) when ``tasks`` is asked for (a
    2025-11-25 session) and an upstream runs tool calls as tasks. Sections the gateway does not route
    (``experimental``, extensions) are not declared.
    """
    caps = [c for c in upstream_caps if isinstance(c, Mapping)]
    out: dict[str, Any] = {"tools": {"listChanged": True}}
    if any("prompts" in c for c in caps):
        out["prompts"] = {"listChanged": True} if _flag(caps, "prompts", "listChanged") else {}
    if any("resources" in c for c in caps):
        resources: dict[str, Any] = {}
        if _flag(caps, "resources", "subscribe"):
            resources["subscribe"] = True
        if _flag(caps, "resources", "listChanged"):
            resources["listChanged"] = True
        out["resources"] = resources
    if any("logging" in c for c in caps):
        out["logging"] = {}
    if any("completions" in c for c in caps):
        out["completions"] = {}
    task_section = task_capability(caps) if tasks else None
    if task_section is not None:
        out["tasks"] = task_section
    return out


def combined_instructions(pairs: Sequence[tuple[str, Any]]) -> str | None:
    """Each upstream's instructions, labelled with its name; None when no upstream gave any."""
    parts = [f"[{name}] {text}" for name, text in pairs if isinstance(text, str) and text.strip()]
    return "\n\n".join(parts) if parts else None
