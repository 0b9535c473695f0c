"""How the gateway can reach the client of the tools/call being decided, and the retry fields it owns.

Invariant: the approval gate (``gateway.approvals``) learns what the client can be asked only from
the transport that carries the call -- the stdio relay of ``drawbridge wrap`` or the downstream
session of ``drawbridge serve`` -- and only for the duration of that call's decision. And a
``requestState`` the gateway minted (prefix ``dbrs1.``), with the ``inputResponses`` sent beside
it, is the gateway's own business: it is verified by the gateway and removed before the call is
forwarded, so the upstream never sees it. Any other ``requestState`` belongs to the upstream's own
``InputRequiredResult`` and is passed on untouched.

Theory of operation. A transport builds one ``ClientLink`` per tools/call -- the ``elicit`` callable
that sends the agent a gateway-originated ``elicitation/create`` (None when the agent did not
declare form elicitation, or cannot take a request from the server), and the gateway's retry fields
of a 2026-07-28 retry, if any -- and sets ``CLIENT_LINK`` around its call to the decider
(``linked``). The decider keeps the ``Decider`` shape (``decide(call) -> Verdict``) and reads the
link from the context; the context variable is per task, so concurrent calls never see each
other's link. A decider called with no link (tests, or a transport that offers nothing) gets
``NO_LINK``: nobody can be asked in-band.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.approval.request_state import PREFIX as GATEWAY_STATE_PREFIX
from drawbridge.gateway.pipeline import ToolCall

RETRY_FIELDS: Final = ("requestState", "inputResponses")

Elicit = Callable[[ToolCall, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""Send the agent ``elicitation/create`` with these params; return its ``ElicitResult`` (raises when the
agent answers with an error or cannot be reached)."""


@dataclass(frozen=True, slots=True)
class ClientLink:
    """What the transport of one tools/call offers the approval gate."""

    elicit: Elicit | None = None
    """In-band question to the agent (2025-11-25 era), when it declared form elicitation."""
    request_state: object | None = None
    """The gateway's ``requestState`` echoed by a 2026-07-28 retry, as sent (unverified)."""
    input_responses: Mapping[str, Any] | None = None
    """The ``inputResponses`` sent beside the gateway's ``requestState``."""

    @property
    def retry(self) -> bool:
        return self.request_state is not None


NO_LINK: Final = ClientLink()
CLIENT_LINK: ContextVar[ClientLink] = ContextVar("drawbridge_client_link", default=NO_LINK)


@contextmanager
def linked(link: ClientLink) -> Iterator[None]:
    """Make ``link`` the current call's link for the block (the decision)."""
    token = CLIENT_LINK.set(link)
    try:
        yield
    finally:
        CLIENT_LINK.reset(token)


def declares_form_elicitation(capabilities: object) -> bool:
    """Whether an ``initialize`` request's client capabilities declare form-mode elicitation."""
    # Imported here: the approval engine imports the pipeline, whose package imports the relays.
    from drawbridge.approval.engine import form_elicitation_declared

    return form_elicitation_declared(capabilities)


def is_gateway_retry(params: object) -> bool:
    """Whether tools/call ``params`` carry a ``requestState`` of the gateway's own form (or claim to)."""
    if not isinstance(params, Mapping):
        return False
    state = params.get("requestState")
    return isinstance(state, str) and state.startswith(GATEWAY_STATE_PREFIX)


def retry_link(params: object, elicit: Elicit | None = None) -> ClientLink:
    """The link for a call with these params: the gateway's retry fields taken out if present."""
    if not is_gateway_retry(params):
        return ClientLink(elicit=elicit)
    assert isinstance(params, Mapping)
    responses = params.get("inputResponses")
    return ClientLink(
        elicit=elicit,
        request_state=params.get("requestState"),
        input_responses=responses if isinstance(responses, Mapping) else None,
    )


def forwardable_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The params to forward upstream for a gateway retry: the gateway's own fields removed."""
    return {k: v for k, v in params.items() if k not in RETRY_FIELDS}


__all__ = [
    "CLIENT_LINK",
    "GATEWAY_STATE_PREFIX",
    "NO_LINK",
    "RETRY_FIELDS",
    "ClientLink",
    "Elicit",
    "declares_form_elicitation",
    "forwardable_params",
    "is_gateway_retry",
    "linked",
    "retry_link",
]
