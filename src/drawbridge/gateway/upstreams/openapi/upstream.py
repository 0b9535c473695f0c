"""An ``openapi:`` entry of the configuration, opened: its spec read, its backend checked, its tools.

Invariant: an OpenAPI upstream is served only once its whole catalogue is known and its backend is
one the SSRF guard lets through: a spec that cannot be fetched, read or resolved, a backend that is
missing, not absolute, holds credentials, a query or a fragment (never echoed), or is on a private
address without ``allow_private``, or a header whose environment variable is empty, is a
``StartError`` (``serve`` and ``discover`` stop with it, exit 2).
Header values are read from the environment here, held by the HTTP client only, and never shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from drawbridge.config import ALLOW_PRIVATE_ADVICE, OpenApiConfig
from drawbridge.config_local import backend_url_problem
from drawbridge.gateway.upstreams.local import LocalTool, LocalUpstream, StartError
from drawbridge.gateway.upstreams.openapi.calls import call_operation
from drawbridge.gateway.upstreams.openapi.spec import Spec, read_spec
from drawbridge.gateway.upstreams.openapi.spec_text import MAX_SPEC_BYTES, SpecError, parse_text, read_file
from drawbridge.gateway.upstreams.openapi.tools import operation_tools
from drawbridge.gateway.upstreams.ssrf import http_client, refusal, resolved_problem


async def fetch_spec(url: str, *, allow_private: bool, timeout: float) -> tuple[Any, str]:
    """The document at ``url`` (through the SSRF guard unless ``allow_private``), and its URL."""
    async with http_client(allow_private=allow_private, timeout=timeout) as client:
        try:
            async with client.stream("GET", url, headers={"Accept": "application/json, application/yaml"}) as response:
                if response.status_code != 200:
                    raise SpecError(f"fetching {url} answered HTTP {response.status_code}")
                data = b""
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > MAX_SPEC_BYTES:
                        raise SpecError(f"the document at {url} is larger than {MAX_SPEC_BYTES} bytes")
        except httpx.HTTPError as exc:
            refused = refusal(exc)
            if refused is not None:
                raise SpecError(f"{refused} (fetching the spec; {ALLOW_PRIVATE_ADVICE})") from None
            raise SpecError(f"cannot fetch {url}: {exc or type(exc).__name__}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"the document at {url} is not UTF-8 text") from None
    return parse_text(text, url), url


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
        raise StartError(f"openapi {config.name!r}: the spec's first server {refused}; set backend_url")
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


async def open_openapi(config: OpenApiConfig, environ: Mapping[str, str]) -> LocalUpstream:
    """The upstream of one ``openapi:`` entry (module docstring); raises ``StartError``."""
    try:
        spec = await load_spec(config)
    except SpecError as exc:
        raise StartError(f"openapi {config.name!r}: {exc}") from None
    backend = await backend_of(config, spec)
    headers: dict[str, str] = {}
    for header, env_name in config.headers_env.items():
        value = environ.get(env_name, "")
        if not value:
            raise StartError(
                f"openapi {config.name!r}: header {header} needs environment variable {env_name}, which is missing or empty"
            )
        headers[header] = value
    tools, skipped = operation_tools(spec, backend, config.operations, headers)
    by_name = {tool.name: tool for tool in tools}
    client = http_client(allow_private=config.allow_private, timeout=config.timeout_seconds, headers=headers)

    async def invoke(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
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
