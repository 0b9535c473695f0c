"""An ``openapi:`` entry of the configuration, opened: its spec read, its backend checked, its tools.

Invariant: an OpenAPI upstream is served only once its whole catalogue is known and its backend is
one the SSRF guard lets through: a spec that cannot be fetched, read or resolved, a backend that is
missing, not absolute, holds credentials, a query or a fragment (never echoed), or is on a private
address without ``allow_private``, or (when the upstream is opened to be called) a header whose
environment variable is empty, is a ``StartError`` (``serve`` stops with it, exit 2; ``discover``
names it). Header values are read from the environment here, held by the HTTP client only, and never
shown; ``discover`` calls no operation, so it opens the upstream without them (``calls=False``). The
spec's ``url`` is shown as ``http_link.safe_url`` shows an MCP upstream's: without credentials or
query.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from drawbridge.config import ALLOW_PRIVATE_ADVICE, OpenApiConfig
from drawbridge.config_local import backend_url_problem
from drawbridge.gateway.upstreams.http_link import safe_url
from drawbridge.gateway.upstreams.local import LocalTool, LocalUpstream, NotSent, StartError
from drawbridge.gateway.upstreams.openapi.calls import call_operation
from drawbridge.gateway.upstreams.openapi.spec import Spec, read_spec
from drawbridge.gateway.upstreams.openapi.spec_text import MAX_SPEC_BYTES, SpecError, parse_text, read_file
from drawbridge.gateway.upstreams.openapi.tools import operation_tools
from drawbridge.gateway.upstreams.ssrf import http_client, refusal, resolved_problem


async def fetch_spec(url: str, *, allow_private: bool, timeout: float) -> tuple[Any, str]:
    """The document at ``url`` (through the SSRF guard unless ``allow_private``), and its URL."""
    shown = safe_url(url)
    async with http_client(allow_private=allow_private, timeout=timeout) as client:
        try:
            async with client.stream("GET", url, headers={"Accept": "application/json, application/yaml"}) as response:
                if response.status_code != 200:
                    raise SpecError(f"fetching {shown} answered HTTP {response.status_code}")
                data = b""
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > MAX_SPEC_BYTES:
                        raise SpecError(f"the document at {shown} is larger than {MAX_SPEC_BYTES} bytes")
        except httpx.HTTPError as exc:
            refused = refusal(exc)
            if refused is not None:
                raise SpecError(f"{refused} (fetching the spec; {ALLOW_PRIVATE_ADVICE})") from None
            raise SpecError(f"cannot fetch {shown}: {_fetch_problem(exc, url)}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"the document at {shown} is not UTF-8 text") from None
    return parse_text(text, shown), url


def _fetch_problem(exc: httpx.HTTPError, url: str) -> str:
    """Why a fetch failed, without the URL's credentials or query (httpx may quote the URL)."""
    text = str(exc) or type(exc).__name__
    parts = urlsplit(url)
    secrets = [piece for piece in (parts.netloc.rpartition("@")[0], parts.query) if piece]
    if any(piece in text for piece in secrets):
        return type(exc).__name__
    return text


async def load_spec(config: OpenApiConfig) -> Spec:
    if config.file is not None:
        document, uri = read_file(config.file)
        return read_spec(document, uri, from_file=True)
    assert config.url is not None
    document, uri = await fetch_spec(config.url, allow_private=config.allow_private, timeout=config.timeout_seconds)
    return read_spec(document, uri, from_file=False)


async def backend_of(config: OpenApiConfig, spec: Spec) -> str:
    backend = config.backend_url or (spec.servers[0] if spec.servers else None)
    if backend is None:
        raise StartError(f"openapi {config.name!r}: the spec lists no server; set backend_url")
    if (refused := backend_url_problem(backend)) is not None:
        source = _backend_source(config, backend)
        raise StartError(f"openapi {config.name!r}: {source} {refused}; set backend_url")
    parts = urlsplit(backend)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StartError(
            f"openapi {config.name!r}: the backend {backend!r} is not an absolute http(s) URL; set backend_url"
        )
    if not config.allow_private:
        problem = await resolved_problem(parts.hostname)
        if problem is not None:
            raise StartError(
                f"openapi {config.name!r}: the backend is refused by the SSRF guard ({problem}); "
                + ALLOW_PRIVATE_ADVICE
            )
    return backend


def _backend_source(config: OpenApiConfig, backend: str) -> str:
    """Where a backend taken from the spec comes from, as a refusal names it: a relative server is
    read against the configured ``url``, whose credentials or query it then holds."""
    if config.url is not None and backend_url_problem(config.url) is not None:
        try:
            same_host = urlsplit(backend).netloc == urlsplit(config.url).netloc
        except ValueError:
            same_host = False
        if same_host:
            return "the spec's first server, read against the configured url (whose part it takes),"
    return "the spec's first server"


async def open_openapi(
    config: OpenApiConfig, environ: Mapping[str, str], *, calls: bool = True
) -> LocalUpstream:
    """The upstream of one ``openapi:`` entry (module docstring); raises ``StartError``. ``calls``
    False (``discover``): the catalogue only, without the headers' secrets; a call is then refused."""
    try:
        spec = await load_spec(config)
    except SpecError as exc:
        raise StartError(f"openapi {config.name!r}: {exc}") from None
    backend = await backend_of(config, spec)
    headers: dict[str, str] = {}
    for header, env_name in config.headers_env.items() if calls else ():
        value = environ.get(env_name, "")
        if not value:
            raise StartError(
                f"openapi {config.name!r}: header {header} needs environment variable {env_name}, which is missing or empty"
            )
        headers[header] = value
    try:
        tools, skipped = operation_tools(spec, backend, config.operations, config.headers_env)
    except SpecError as exc:
        raise StartError(f"openapi {config.name!r}: {exc}") from None
    by_name = {tool.name: tool for tool in tools}
    client = http_client(allow_private=config.allow_private, timeout=config.timeout_seconds, headers=headers)

    async def invoke(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if not calls:
            raise NotSent("the upstream was opened to read its catalogue only")
        return await call_operation(
            client, backend, by_name[name], arguments,
            max_response_bytes=config.max_response_bytes, timeout=config.timeout_seconds,
        )

    title = f" {spec.title!r}" if spec.title else ""
    return LocalUpstream(
        config.name,
        "openapi",
        [LocalTool(tool.item, openapi_method=tool.operation.method) for tool in tools],
        invoke,
        close=client.aclose,
        not_served=skipped,
        detail=f"OpenAPI{title}, {len(tools)} operation(s), backend {backend}",
    )


__all__ = ["backend_of", "fetch_spec", "load_spec", "open_openapi"]
