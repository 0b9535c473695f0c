"""Who answers each method an agent sends: the table every ``DownstreamSession`` dispatches by, and
``open_session``, which gives a new session that table.

Invariant: a method the table does not name is refused with -32601 (the gateway cannot tell which
upstream serves it), never guessed, and ``tools/call`` has exactly one handler, the pipeline's
(``tool_calls.py``). A method that is not exactly ``tools/call`` but an upstream might run as one is
refused before the table is looked at (``DownstreamSession``).

=========================  ==============================================================================
initialize, ping           the gateway (capabilities: the union of what upstreams offer; serverInfo drawbridge)
server/discover            the gateway (2026-07-28)
tools/list                 the gateway, from the merged catalogue (``server.tool`` names), per agent; to a
                           2026-07-28 agent without the tools that run only as tasks
tools/call                 decided, then forwarded to the tool's upstream with the prefix removed
prompts/list               every upstream that offers prompts, merged, names namespaced like tools
prompts/get                the upstream named by the prefix, prefix removed
resources/list, templates  every upstream that offers resources, merged; URIs are not rewritten
resources/read, subscribe  the upstream that listed the URI (or whose template matches it); subscribe and
                           unsubscribe are the handshake era's (2026-07-28 listens instead)
completion/complete        by the reference: a namespaced prompt, or a resource URI
logging/setLevel           answered by the gateway and not forwarded (upstream sessions are shared)
subscriptions/listen       the gateway (2026-07-28): the list changes of tools, prompts and resources
tasks/get, result, cancel  the upstream running the agent's own task, ids mapped (2025-11-25)
tasks/list                 the gateway, from the agent's own tasks
anything else              -32601: the gateway cannot tell which upstream serves it
=========================  ==============================================================================

A 2026-07-28 request for a method that version removed (``ping``, ``logging/setLevel``,
``resources/subscribe``, ``resources/unsubscribe``: ``methods.REMOVED_BY_MODERN``) is -32601 too,
refused (and recorded) by the session before the table is looked at: the subscribe pair would subscribe an
upstream for a request that ends with its answer, so no update could ever reach the agent.

Theory of operation. The handlers take the session as it is (``downstream_session.py``), so the table
is built here, above both: the gateway's own answers (``gateway_answers.py``), the decided call
(``tool_calls.py``), the catalogue requests routed to upstreams (``catalogue_routes.py``), the
subscriptions (``subscription_routes.py``) and the tasks of task-augmented calls (``task_routes.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from drawbridge.gateway.protocol.methods import (
    COMPLETE,
    DISCOVER,
    INITIALIZE,
    LISTEN,
    PING,
    PROMPTS_GET,
    PROMPTS_LIST,
    RESOURCE_TEMPLATES_LIST,
    RESOURCES_LIST,
    RESOURCES_READ,
    RESOURCES_SUBSCRIBE,
    RESOURCES_UNSUBSCRIBE,
    SET_LEVEL,
    TOOLS_CALL,
    TOOLS_LIST,
)
from drawbridge.gateway.protocol.tasks import TASKS_CANCEL, TASKS_GET, TASKS_LIST, TASKS_RESULT
from drawbridge.gateway.serve import catalogue_routes, gateway_answers, subscription_routes, task_routes, tool_calls
from drawbridge.gateway.serve.agents import Outbound
from drawbridge.gateway.serve.downstream_session import DownstreamSession, Handler
from drawbridge.gateway.serve.hub import Gateway

ROUTES: Final[Mapping[str, Handler]] = {
    INITIALIZE: gateway_answers.initialize,
    PING: gateway_answers.acknowledge,
    DISCOVER: gateway_answers.discover,
    TOOLS_LIST: gateway_answers.tools_list,
    TOOLS_CALL: tool_calls.tools_call,
    PROMPTS_LIST: catalogue_routes.prompts_list,
    PROMPTS_GET: catalogue_routes.prompts_get,
    RESOURCES_LIST: catalogue_routes.resources_list,
    RESOURCE_TEMPLATES_LIST: catalogue_routes.templates_list,
    RESOURCES_READ: catalogue_routes.by_uri,
    RESOURCES_SUBSCRIBE: subscription_routes.subscribe,
    RESOURCES_UNSUBSCRIBE: subscription_routes.subscribe,
    COMPLETE: catalogue_routes.complete,
    SET_LEVEL: gateway_answers.acknowledge,
    LISTEN: subscription_routes.listen,
    TASKS_GET: task_routes.by_task,
    TASKS_RESULT: task_routes.by_task,
    TASKS_CANCEL: task_routes.by_task,
    TASKS_LIST: task_routes.tasks_list,
}


def open_session(gateway: Gateway, agent: str, outbound: Outbound, *, transport: str) -> DownstreamSession:
    """A new agent connection on ``gateway``: registered there until it closes."""
    session = DownstreamSession(gateway, agent, outbound, handlers=ROUTES, transport=transport)
    gateway.sessions.add(session)
    return session


__all__ = ["ROUTES", "open_session"]
