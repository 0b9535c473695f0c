"""Prompts, resources and completions: the catalogue requests an agent sends, routed to the upstreams
that serve them.

Invariant: none of these is decided, and each goes only to an upstream the gateway can name for it: a
list to every ready upstream that offers the capability (merged; one that fails is left out, the
others still answer), a prompt by its ``<server>.<prompt>`` name (the prefix removed on the way), a
resource by the upstream that listed its URI or whose template matches it (``resource_routes.py``),
a completion by its reference, which is one of the two. A name or URI that routes nowhere is refused
with invalid params, never sent to a guess.

Theory of operation. Prompt names are namespaced like tool names (``catalogue.merged``), so
``prompts/list`` is merged the way ``tools/list`` is, and a prompt that cannot be served under its name
is logged and left out. Under ``pin_prompts`` (``prompt_pins.py``) each upstream's prompts are shown as
accepted, and ``prompts/get`` of one that is not, or ``completion/complete`` of its arguments, is
refused before it is relayed. Resource URIs are not rewritten; the lists an agent fetches teach the gateway
which upstream owns which URI, and a URI not known yet has every upstream's resources listed again
before it is refused. The request itself is relayed by the session (``DownstreamSession.relay``).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from drawbridge.catalogue.merged import build_catalogue
from drawbridge.catalogue.names import split_namespaced, tool_name_problem
from drawbridge.gateway.protocol.jsonrpc import INVALID_PARAMS, MessageError
from drawbridge.gateway.protocol.methods import PROMPTS_LIST, RESOURCE_TEMPLATES_LIST, RESOURCES_LIST
from drawbridge.gateway.serve.downstream_session import DownstreamSession, Inflight, error_response
from drawbridge.gateway.serve.prompt_pins import HELD_BACK_INCIDENT, PinnedPromptsGateway
from drawbridge.gateway.upstreams.session import UpstreamSession

logger = logging.getLogger("drawbridge.gateway")


async def _fan_out(
    session: DownstreamSession, method: str, key: str, capability: str
) -> dict[str, list[Any]]:
    """Every page of ``method`` from every ready upstream offering ``capability``, by upstream name."""
    upstreams = [u for u in session.gateway.upstreams.values() if u.ready and capability in u.capabilities]
    found: dict[str, list[Any]] = {}

    async def one(upstream: UpstreamSession) -> None:
        try:
            found[upstream.name] = await upstream.list_all(method, key)
        except Exception as exc:  # noqa: BLE001 -- the others still answer
            logger.warning("upstream %r: %s failed (%s); its items are left out", upstream.name, method, exc)

    async with anyio.create_task_group() as tg:
        for upstream in upstreams:
            tg.start_soon(one, upstream)
    return {u.name: found[u.name] for u in upstreams if u.name in found}


def _named_route(
    session: DownstreamSession, entry: Inflight, name: Any, kind: str
) -> tuple[UpstreamSession, str]:
    if not isinstance(name, str):
        raise MessageError(INVALID_PARAMS, f"invalid params: the {kind} name must be a string", entry.message.id)
    problem = tool_name_problem(name)
    split = split_namespaced(name) if problem is None else None
    upstream = session.gateway.upstreams.get(split[0]) if split is not None else None
    if upstream is None or split is None:
        raise MessageError(
            INVALID_PARAMS,
            f"invalid params: unknown {kind}: names are <server>{'.'}<{kind}> (see {kind}s/list)",
            entry.message.id,
        )
    return upstream, split[1]


async def uri_route(session: DownstreamSession, entry: Inflight, uri: Any) -> UpstreamSession:
    """The upstream that serves ``uri``; raises ``MessageError`` (invalid params) when none does."""
    if not isinstance(uri, str) or not uri:
        raise MessageError(INVALID_PARAMS, "invalid params: uri must be a non-empty string", entry.message.id)
    routes = session.gateway.resources
    upstream = routes.resource_upstream(uri)
    if upstream is None:
        await routes.relearn_resources()
        upstream = routes.resource_upstream(uri)
    if upstream is None:
        raise MessageError(
            INVALID_PARAMS, "invalid params: no upstream lists this resource URI or a template matching it", entry.message.id
        )
    return upstream


async def prompts_list(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    found = await _fan_out(session, PROMPTS_LIST, "prompts", "prompts")
    gateway = session.gateway
    if isinstance(gateway, PinnedPromptsGateway):  # pin_prompts: only accepted definitions
        found = {name: await gateway.shown_prompts(name, items) for name, items in found.items()}
    catalogue = build_catalogue(list(found.items()), "prompt")
    for problem in catalogue.problems:
        logger.warning("prompt not served: %s", problem.describe())
    return session.result(entry, {"prompts": catalogue.listing()})


async def prompts_get(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    params = entry.message.params if isinstance(entry.message.params, dict) else {}
    upstream, name = _named_route(session, entry, params.get("name"), "prompt")
    if (held := await _held_back(session, entry, upstream, name)) is not None:
        return held
    return await session.relay(entry, upstream, params, name=name)


async def _held_back(
    session: DownstreamSession, entry: Inflight, upstream: UpstreamSession, name: str
) -> dict[str, Any] | None:
    """Under ``pin_prompts``: the refusal of a request naming a prompt that is not pinned (its get, or
    a completion of its arguments), recorded as ``prompt_held_back``; None when it may be relayed."""
    gateway = session.gateway
    if isinstance(gateway, PinnedPromptsGateway):
        refusal = await gateway.prompt_refusal(upstream.name, name)
        if refusal is not None:
            await gateway.incident(HELD_BACK_INCIDENT, "client", refusal, INVALID_PARAMS, agent=session.agent)
            return error_response(entry.message.id, INVALID_PARAMS, refusal)
    return None


async def resources_list(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    found = await _fan_out(session, RESOURCES_LIST, "resources", "resources")
    merged: list[Any] = []
    for name, items in found.items():
        session.gateway.resources.learn_resources(name, items)
        merged.extend(items)
    return session.result(entry, {"resources": merged})


async def templates_list(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    found = await _fan_out(session, RESOURCE_TEMPLATES_LIST, "resourceTemplates", "resources")
    merged: list[Any] = []
    for name, items in found.items():
        session.gateway.resources.learn_templates(name, items)
        merged.extend(items)
    return session.result(entry, {"resourceTemplates": merged})


async def by_uri(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    """``resources/read``: relayed to the upstream that serves the URI."""
    params = entry.message.params if isinstance(entry.message.params, dict) else {}
    upstream = await uri_route(session, entry, params.get("uri"))
    return await session.relay(entry, upstream, params)


async def complete(session: DownstreamSession, entry: Inflight) -> dict[str, Any]:
    params = entry.message.params if isinstance(entry.message.params, dict) else {}
    ref = params.get("ref")
    if not isinstance(ref, dict):
        return await session.refuse(entry.message.id, INVALID_PARAMS, "invalid params: ref must be an object")
    if ref.get("type") == "ref/prompt":
        upstream, name = _named_route(session, entry, ref.get("name"), "prompt")
        if (held := await _held_back(session, entry, upstream, name)) is not None:
            return held
        return await session.relay(entry, upstream, params, name={**ref, "name": name}, name_key="ref")
    if ref.get("type") == "ref/resource":
        upstream = await uri_route(session, entry, ref.get("uri"))
        return await session.relay(entry, upstream, params)
    return await session.refuse(
        entry.message.id, INVALID_PARAMS, "invalid params: ref.type must be ref/prompt or ref/resource"
    )


__all__ = [
    "by_uri", "complete", "prompts_get", "prompts_list", "resources_list", "templates_list", "uri_route",
]
