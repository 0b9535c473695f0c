"""How the gateway can reach the client of the tools/call being decided, and the retry fields it owns.

Invariant: the approval gate (``approvals.gate``) learns what the client can be asked only from the
transport that carries the call -- wrap's stdio relay or serve's downstream session, each the call's
``Replier`` -- and only for that call's decision, through the ``ClientLink`` the pipeline hands it.
And a ``requestState`` this gateway minted (prefix ``dbrs1.`` and the id of one of its keys:
``request_state.issued_here``) is the gateway's own business: it is verified by the gateway and
removed before the call is forwarded, so the upstream never sees it. For the state of the gateway's
own question, the ``inputResponses`` beside it are the gateway's too and are removed with it; a
continuation (the state the gateway handed out in place of the upstream's own, once the call was
approved) is replaced by the upstream's ``requestState`` it carries, and the ``inputResponses`` go
to the upstream unchanged. Any other ``requestState`` -- the upstream's, or another gateway's
further upstream -- is passed on untouched.

Theory of operation. The pipeline builds one ``ClientLink`` per call that needs approval: the
``elicit`` callable that sends the agent a gateway-originated ``elicitation/create`` (None when the
agent declared no elicitation, or cannot take a request from the server; an ``InBand`` saying which
modes it declared), and the
gateway's retry fields of a 2026-07-28 retry, if any. A call with no link gets ``NO_LINK``: nobody
can be asked in-band.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.approval.request_state import PREFIX as GATEWAY_STATE_PREFIX
from drawbridge.approval.request_state import carried_upstream_state
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.protocol.eras import CLIENT_CAPABILITIES_META_KEY

RETRY_FIELDS: Final = ("requestState", "inputResponses")

Owns = Callable[[object], bool]
"""Whether a ``requestState`` was sealed by this gateway (``ApprovalEngine.owns_state``)."""

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

    continuation: bool = False
    """The state reads as a continuation of an approved call (unverified: the approval stage opens it)."""

    @property
    def retry(self) -> bool:
        return self.request_state is not None


NO_LINK: Final = ClientLink()
def declares_form_elicitation(capabilities: object) -> bool:
    """Whether client capabilities declare form-mode elicitation (an empty ``elicitation`` means form)."""
    if not isinstance(capabilities, Mapping):
        return False
    elicitation = capabilities.get("elicitation")
    if not isinstance(elicitation, Mapping):
        return False
    if "form" in elicitation:
        return isinstance(elicitation["form"], Mapping)
    return "url" not in elicitation


def declares_url_elicitation(capabilities: object) -> bool:
    """Whether client capabilities declare URL-mode elicitation (``elicitation: {url: {}}``, 2025-11-25)."""
    if not isinstance(capabilities, Mapping):
        return False
    elicitation = capabilities.get("elicitation")
    return isinstance(elicitation, Mapping) and isinstance(elicitation.get("url"), Mapping)


@dataclass(frozen=True)
class InBand:
    """A transport's in-band asker with the elicitation modes its client declared: the gate sends a
    form question only where ``form`` holds, and an approval link (``approvals.by_link``) only where
    ``url`` does."""

    ask: Elicit
    form: bool
    url: bool

    async def __call__(self, call: ToolCall, params: Mapping[str, Any]) -> Mapping[str, Any]:
        return await self.ask(call, params)


def in_band(ask: Elicit, capabilities: object) -> InBand | None:
    """``ask`` as an ``InBand`` for a client with these capabilities; None when it declared no mode."""
    form, url = declares_form_elicitation(capabilities), declares_url_elicitation(capabilities)
    return InBand(ask, form, url) if form or url else None


def call_declares_elicitation(call: ToolCall) -> bool:
    """For a 2026-07-28 call: the client capabilities carried in its ``_meta`` declare form elicitation."""
    meta = call.meta if isinstance(call.meta, Mapping) else {}
    return call.modern and declares_form_elicitation(meta.get(CLIENT_CAPABILITIES_META_KEY))


def _has_our_prefix(state: object) -> bool:
    return isinstance(state, str) and state.startswith(GATEWAY_STATE_PREFIX)


def is_gateway_retry(params: object, owns: Owns = _has_our_prefix) -> bool:
    """Whether tools/call ``params`` carry a ``requestState`` this gateway sealed (or claim to, under
    its key id); ``owns`` defaults to the prefix alone."""
    if not isinstance(params, dict):  # parsed JSON: an object is a dict
        return False
    state = params.get("requestState")
    return _has_our_prefix(state) and owns(state)


def retry_link(params: object, elicit: Elicit | None = None, owns: Owns = _has_our_prefix) -> ClientLink:
    """The link for a call with these params: the gateway's retry fields taken out if present."""
    if not is_gateway_retry(params, owns):
        return ClientLink(elicit=elicit)
    assert isinstance(params, Mapping)
    responses = params.get("inputResponses")
    state = params.get("requestState")
    return ClientLink(
        elicit=elicit,
        request_state=state,
        input_responses=responses if isinstance(responses, Mapping) else None,
        continuation=carried_upstream_state(state)[0],
    )


def forwardable_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The params to forward upstream for a gateway retry: the gateway's own fields removed, and for
    a continuation the upstream's ``requestState`` put back (module docstring). What is read here is
    not verified yet; the call is forwarded only once the approval stage has opened the same bytes."""
    continued, upstream_state = carried_upstream_state(params.get("requestState"))
    if not continued:
        return {k: v for k, v in params.items() if k not in RETRY_FIELDS}
    forwarded = {k: v for k, v in params.items() if k != "requestState"}
    if upstream_state is not None:
        forwarded["requestState"] = upstream_state
    return forwarded


__all__ = [
    "CLIENT_CAPABILITIES_META_KEY",
    "GATEWAY_STATE_PREFIX",
    "NO_LINK",
    "Owns",
    "RETRY_FIELDS",
    "ClientLink",
    "Elicit",
    "InBand",
    "call_declares_elicitation",
    "declares_form_elicitation",
    "declares_url_elicitation",
    "forwardable_params",
    "in_band",
    "is_gateway_retry",
    "retry_link",
]
