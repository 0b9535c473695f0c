"""Which upstream serves a resource URI, when several upstreams offer resources behind one gateway.

Invariant: resource URIs are not namespaced (agents read them as the upstreams wrote them), so a URI
routes only to an upstream that answered for it: the one that listed it first, else the first whose
template matches it, else the one upstream that offers resources at all. When none of these holds the
answer is None, and the request is refused rather than sent to a guess.

Theory of operation. The table is learned from the ``resources/list`` and ``resources/templates/list``
answers that pass through the gateway (``catalogue_routes.py``), forgotten for an upstream whose
resource list changed (``hub.py``), and learned again from every ready upstream when a URI is not
known (``relearn_resources``). A template that cannot be parsed is left out: it routes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from drawbridge.gateway.protocol.methods import RESOURCE_TEMPLATES_LIST, RESOURCES_LIST
from drawbridge.gateway.upstreams.sdk_parts import InvalidUriTemplate, UriTemplate
from drawbridge.gateway.upstreams.session import UpstreamSession

logger = logging.getLogger("drawbridge.gateway")


class ResourceRoutes:
    """The resource URIs and templates each upstream listed (module docstring)."""

    def __init__(self, upstreams: Mapping[str, UpstreamSession]) -> None:
        self._upstreams = upstreams
        self._resource_owner: dict[str, str] = {}
        self._templates: list[tuple[str, str, UriTemplate]] = []

    def forget_resources(self, upstream: str) -> None:
        for uri in [u for u, owner in self._resource_owner.items() if owner == upstream]:
            del self._resource_owner[uri]
        self._templates = [t for t in self._templates if t[0] != upstream]

    def learn_resources(self, upstream: str, items: Sequence[Any]) -> None:
        for item in items:
            uri = item.get("uri") if isinstance(item, dict) else None
            if isinstance(uri, str):
                self._resource_owner.setdefault(uri, upstream)

    def learn_templates(self, upstream: str, items: Sequence[Any]) -> None:
        self._templates = [t for t in self._templates if t[0] != upstream]
        for item in items:
            text = item.get("uriTemplate") if isinstance(item, dict) else None
            if not isinstance(text, str):
                continue
            try:
                self._templates.append((upstream, text, UriTemplate.parse(text)))
            except (InvalidUriTemplate, ValueError):
                logger.info("upstream %r lists a resource template that cannot be parsed; not routable", upstream)

    def resource_upstream(self, uri: str) -> UpstreamSession | None:
        owner = self._resource_owner.get(uri)
        if owner is None:
            for name, text, template in self._templates:
                if text == uri or template.match(uri) is not None:
                    owner = name
                    break
        if owner is None:
            offering = [u for u in self._upstreams.values() if "resources" in u.capabilities]
            if len(offering) == 1:
                return offering[0]
            return None
        return self._upstreams.get(owner)

    def resource_upstreams(self) -> list[UpstreamSession]:
        return [u for u in self._upstreams.values() if u.ready and "resources" in u.capabilities]

    async def relearn_resources(self) -> None:
        for upstream in self.resource_upstreams():
            try:
                self.learn_resources(upstream.name, await upstream.list_all(RESOURCES_LIST, "resources"))
                self.learn_templates(
                    upstream.name, await upstream.list_all(RESOURCE_TEMPLATES_LIST, "resourceTemplates")
                )
            except Exception as exc:  # noqa: BLE001 -- one upstream's failure leaves the others routable
                logger.warning("listing the resources of upstream %r failed (%s)", upstream.name, type(exc).__name__)


__all__ = ["ResourceRoutes"]
