"""An OpenAPI 3.0 or 3.1 document read into the operations the gateway serves, every ``$ref`` resolved.

Invariant: an operation is served only as the document states it, read one way. The document is JSON
or YAML with no key given twice; its ``$ref``s (Reference Objects and schema references alike) are
resolved by ``referencing`` (the JSON Schema reference resolver of the ``jsonschema`` project), never by
hand; a reference that cannot be resolved or that leaves the spec's directory, a schema that reaches
itself through references alone (checking an argument against it would never end), a version other
than 3.0.x or 3.1.x, or a part the gateway reads that has the wrong shape makes the whole document a
load error (``SpecError``) naming where, never quoting what a referenced file holds. An
operation the gateway cannot call as the document describes it (a required cookie parameter, a body
that is not JSON, two parameters that would share one argument name) is left out and named in
``Spec.skipped``, never served half-understood.

Theory of operation. The document (read by ``spec_text``) is one resource in a ``referencing.Registry``
at its own URI (the spec file's ``file:`` URI, or the URL it was fetched from). Other documents are
retrieved only for a spec read from a file, from files in its own directory or below it (symlinks
resolved first: a link out of it is refused, as is an absolute path elsewhere); a spec fetched by URL
may only refer inside itself. YAML is held to the configuration's bounds before it is built.
Reference Objects (a parameter, a request body, a path item) are followed until a real object is
reached. Schemas are *bundled*: every ``$ref`` (and ``$dynamicRef`` naming a place, not an anchor)
in a parameter's or the body's schema is replaced by ``#/$defs/<name>`` and the schema it points to
is copied once into the tool's ``$defs`` (a recursive schema refers to itself there), so each tool's
``inputSchema`` stands alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT4, DRAFT202012

from drawbridge.gateway.upstreams.openapi.spec_text import SpecError, file_retriever, refuse_retrieval

METHODS: Final = ("get", "put", "post", "delete", "patch", "head")
"""The operations served; ``options`` and ``trace`` are not calls an agent makes."""
LOCATIONS: Final = ("path", "query", "header")
IGNORED_HEADERS: Final = frozenset({"accept", "content-type", "authorization"})
"""Header parameters OpenAPI says to ignore: the gateway sets these itself."""
MAX_REF_HOPS: Final = 64
_VERSION = re.compile(r"3\.(0|1)\.\d+")


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    location: str
    required: bool
    schema: Any
    description: str | None = None
    explode: bool = True
    """For an array in the query: ``tag=a&tag=b`` (true, the default) or ``tag=a,b``."""


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    """Upper case."""
    path: str
    operation_id: str | None
    summary: str | None
    description: str | None
    parameters: tuple[Parameter, ...]
    body_schema: Any = None
    body_required: bool = False
    body_description: str | None = None
    defs: Mapping[str, Any] | None = None
    """The schemas the parameters' and the body's schemas refer to (``#/$defs/<name>``)."""

    @property
    def has_body(self) -> bool:
        return self.body_schema is not None


@dataclass(frozen=True, slots=True)
class Spec:
    version: str
    title: str | None
    servers: tuple[str, ...]
    operations: tuple[Operation, ...]
    skipped: tuple[str, ...] = ()
    """Operations left out, each with why."""


# ------------------------------------------------------------------------------------------ reading


# ------------------------------------------------------------------------------------------ resolving


def _joined(base: str, ref: str) -> str:
    """``ref`` made absolute against ``base``; a reference that is no URL (``http://[::1``) is a
    ``SpecError`` naming it."""
    try:
        joined = urljoin(base, ref)
        urlsplit(joined)  # urljoin lets some malformed URLs through that splitting refuses
    except ValueError as exc:
        raise SpecError(f"the reference {ref[:200]!r} is not a valid URL ({exc})") from None
    return joined


class _Resolver:
    """Follows ``$ref``s from a base URI, and bundles schemas into one ``$defs``."""

    def __init__(self, registry: Registry[Any], base: str) -> None:
        self.registry = registry
        self.base = base

    def lookup(self, ref: str, base: str) -> tuple[Any, str]:
        """The target of ``ref`` read from a document at ``base``, and the target's absolute URI."""
        target = _joined(base, ref)
        try:
            resolved = self.registry.resolver(base_uri=base).lookup(ref)
        except SpecError:
            raise
        except Unresolvable as exc:
            cause: BaseException | None = exc
            while cause is not None:  # a retriever's refusal says why
                if isinstance(cause, SpecError):
                    raise cause from None
                cause = cause.__cause__ or cause.__context__
            raise SpecError(f"the reference {ref!r} cannot be resolved ({type(exc).__name__})") from None
        except Exception as exc:  # noqa: BLE001 -- a retriever's failure, whatever it was
            raise SpecError(f"the reference {ref!r} cannot be resolved ({exc})") from None
        return resolved.contents, target

    def follow(self, value: Any, base: str, what: str) -> tuple[Any, str]:
        """A Reference Object followed to the object it names (and that object's document URI)."""
        hops = 0
        while isinstance(value, Mapping) and isinstance(value.get("$ref"), str):
            hops += 1
            if hops > MAX_REF_HOPS:
                raise SpecError(f"{what}: references loop")
            value, target = self.lookup(value["$ref"], base)
            base = urldefrag(target)[0]
        return value, base


def _located(ref: Any) -> bool:
    """A ``$dynamicRef`` that names a place (a JSON Pointer or another document), not an anchor: it is
    resolved as a ``$ref`` is, so it is bundled as one. One naming an anchor (``#meta``) is kept, and
    must find its anchor in the tool's ``inputSchema`` (``tools``)."""
    if not isinstance(ref, str):
        return False
    return not ref.startswith("#") or ref.startswith("#/") or ref == "#"


class _Bundle:
    """One tool's schemas: every ``$ref`` becomes ``#/$defs/<name>``, each target copied once."""

    def __init__(self, resolver: _Resolver, openapi30: bool) -> None:
        self._resolver = resolver
        self._openapi30 = openapi30
        self.defs: dict[str, Any] = {}
        self._names: dict[str, str] = {}

    def schema(self, schema: Any, base: str, depth: int = 0) -> Any:
        if depth > 256:
            raise SpecError("a schema nests deeper than 256 levels")
        if isinstance(schema, Mapping):
            out: dict[str, Any] = {}
            for key, value in schema.items():
                if not isinstance(key, str):
                    raise SpecError("a schema has a key that is not a string")
                if key == "$ref" and isinstance(value, str) or key == "$dynamicRef" and _located(value):
                    out[key] = f"#/$defs/{self._def(value, base, depth)}"
                elif key in ("$id", "$schema"):
                    continue  # the bundled schema lives in the tool's inputSchema, under its base
                else:
                    out[key] = self.schema(value, base, depth + 1)
            return _from_openapi30(out) if self._openapi30 else out
        if isinstance(schema, list):
            return [self.schema(item, base, depth + 1) for item in schema]
        return schema

    def _def(self, ref: str, base: str, depth: int) -> str:
        target_uri = _joined(base, ref)
        name = self._names.get(target_uri)
        if name is not None:
            return name
        fragment = urldefrag(target_uri)[1]
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", unquote(fragment.rsplit("/", 1)[-1])) or "schema"
        name, n = stem, 1
        while name in self.defs:
            n += 1
            name = f"{stem}_{n}"
        self._names[target_uri] = name
        self.defs[name] = True  # taken now: a schema that refers to itself finds its name
        target, uri = self._resolver.lookup(ref, base)
        self.defs[name] = self.schema(target, urldefrag(uri)[0], depth + 1)
        return name


_SAME_VALUE_LISTS: Final = ("allOf", "anyOf", "oneOf")
_SAME_VALUE_ONES: Final = ("not", "if", "then", "else")
"""Keywords whose schemas apply to the value itself, not to a part of it: a loop through only these
(and ``$ref``) never reaches a smaller value, so checking an argument against it never ends."""


def _same_value_refs(schema: Any) -> set[str]:
    """The ``$defs`` a bundled schema applies to the same value (not to an item or a property)."""
    found: set[str] = set()
    pending = [schema]
    while pending:
        current = pending.pop()
        if not isinstance(current, Mapping):
            continue
        ref = current.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            found.add(ref.removeprefix("#/$defs/"))
        for key in _SAME_VALUE_LISTS:
            if isinstance(current.get(key), list):
                pending.extend(current[key])
        pending.extend(current.get(key) for key in _SAME_VALUE_ONES)
        if isinstance(current.get("dependentSchemas"), Mapping):
            pending.extend(current["dependentSchemas"].values())
    return found


def _refuse_loops(defs: Mapping[str, Any], what: str) -> None:
    """A ``SpecError`` naming a schema that reaches itself through references alone (``S: {$ref: S2}``,
    ``S2: {$ref: S}``): checking an argument against it would recurse without end."""
    edges = {name: _same_value_refs(schema) for name, schema in defs.items()}
    done: set[str] = set()
    for start in edges:
        trail: list[str] = []
        stack: list[tuple[str, bool]] = [(start, False)]
        on_trail: set[str] = set()
        while stack:
            name, leaving = stack.pop()
            if leaving:
                on_trail.discard(trail.pop())
                done.add(name)
                continue
            if name in on_trail:
                loop = " -> ".join([*trail[trail.index(name):], name])
                raise SpecError(f"{what}: schema references loop ({loop[:300]})")
            if name in done or name not in edges:
                continue
            trail.append(name)
            on_trail.add(name)
            stack.append((name, True))
            stack.extend((target, False) for target in edges[name])


def _from_openapi30(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI 3.0 schema object in JSON Schema 2020-12 terms (what ``inputSchema`` is):
    ``nullable: true`` admits null, boolean ``exclusiveMinimum``/``exclusiveMaximum`` take the bound."""
    if schema.pop("nullable", None) is True:
        declared = schema.get("type")
        if isinstance(declared, str):
            schema["type"] = [declared, "null"]
        elif isinstance(declared, list) and "null" not in declared:
            schema["type"] = [*declared, "null"]
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = schema.get(exclusive)
        if isinstance(flag, bool):
            del schema[exclusive]
            if flag and bound in schema:
                schema[exclusive] = schema.pop(bound)
    return schema


# ------------------------------------------------------------------------------------------ the shape


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{what} must be an object")
    return value


def _json_media(content: Any, what: str) -> tuple[Any, bool] | None:
    """The schema of the JSON media type of a ``content`` map (True when one is there), or None."""
    content = _mapping(content, f"{what}.content")
    for media, body in content.items():
        kind = str(media).split(";", 1)[0].strip().lower()
        if kind == "application/json" or kind.endswith("+json"):
            body = _mapping(body, f"{what}.content[{media}]")
            return body.get("schema", {}), True
    return None


class _Reader:
    def __init__(self, document: Mapping[str, Any], resolver: _Resolver) -> None:
        self.document = document
        self.resolver = resolver

    def parameters(self, raw: Any, base: str, what: str) -> dict[tuple[str, str], tuple[Any, str]]:
        if raw is None:
            return {}
        if not isinstance(raw, list):
            raise SpecError(f"{what}.parameters must be a list")
        out: dict[tuple[str, str], tuple[Any, str]] = {}
        for index, item in enumerate(raw):
            value, where = self.resolver.follow(item, base, f"{what}.parameters[{index}]")
            value = _mapping(value, f"{what}.parameters[{index}]")
            name, location = value.get("name"), value.get("in")
            if not isinstance(name, str) or not name or not isinstance(location, str):
                raise SpecError(f"{what}.parameters[{index}] needs a name and an in")
            out[(name, location)] = (value, where)
        return out

    def operation(self, path: str, method: str, raw: Any, shared: dict[tuple[str, str], tuple[Any, str]],
                  base: str, bundle: _Bundle) -> Operation | str:
        """The operation, or why it is not served."""
        what = f"paths[{path}].{method}"
        raw = _mapping(raw, what)
        merged = dict(shared)
        merged.update(self.parameters(raw.get("parameters"), base, what))
        parameters: list[Parameter] = []
        names: set[str] = set()
        for (name, location), (value, where) in merged.items():
            if location == "cookie":
                if value.get("required") is True:
                    return f"{method.upper()} {path}: a required cookie parameter ({name}) cannot be sent"
                continue
            if location not in LOCATIONS:
                raise SpecError(f"{what}: parameter {name!r} has an unknown location {location!r}")
            if location == "header" and name.lower() in IGNORED_HEADERS:
                continue
            if name in names or name == "body":
                return f"{method.upper()} {path}: two parameters would share the argument name {name!r}"
            names.add(name)
            schema: Any = value.get("schema")
            if schema is None and value.get("content") is not None:
                media = _json_media(value["content"], f"{what} parameter {name!r}")
                schema = media[0] if media is not None else None
            if schema is None:
                schema = {}
            explode = value.get("explode")
            parameters.append(
                Parameter(
                    name=name,
                    location=location,
                    required=location == "path" or value.get("required") is True,
                    schema=bundle.schema(schema, where),
                    description=_text(value.get("description")),
                    explode=explode if isinstance(explode, bool) else value.get("style", "form") == "form",
                )
            )
        for placeholder in re.findall(r"\{([^}]*)\}", path):
            if placeholder not in names or not any(p.name == placeholder and p.location == "path" for p in parameters):
                return f"{method.upper()} {path}: the path parameter {placeholder!r} is not declared"
        body_schema, body_required, body_description = None, False, None
        if raw.get("requestBody") is not None:
            body, where = self.resolver.follow(raw["requestBody"], base, f"{what}.requestBody")
            body = _mapping(body, f"{what}.requestBody")
            media = _json_media(body.get("content", {}), f"{what}.requestBody")
            body_required = body.get("required") is True
            if media is None:
                if body_required:
                    return f"{method.upper()} {path}: the request body is not JSON"
            else:
                body_schema = bundle.schema(media[0], where)
                body_description = _text(body.get("description"))
        _refuse_loops(bundle.defs, what)
        operation_id = raw.get("operationId")
        return Operation(
            method=method.upper(),
            path=path,
            operation_id=operation_id if isinstance(operation_id, str) and operation_id else None,
            summary=_text(raw.get("summary")),
            description=_text(raw.get("description")),
            parameters=tuple(parameters),
            body_schema=body_schema,
            body_required=body_required,
            body_description=body_description,
            defs=dict(bundle.defs) or None,
        )


def read_spec(document: Any, uri: str, *, from_file: bool) -> Spec:
    """The operations of a parsed document at ``uri`` (module docstring); raises ``SpecError``."""
    document = _mapping(document, "the OpenAPI document")
    version = document.get("openapi")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        shown = version if isinstance(version, str) else type(version).__name__
        raise SpecError(f"the document is not OpenAPI 3.0 or 3.1 (openapi: {shown!r})"[:300])
    specification = DRAFT202012 if version.startswith("3.1") else DRAFT4
    retrieve = file_retriever(uri) if from_file else refuse_retrieval
    registry: Registry[Any] = Registry(retrieve=retrieve).with_resource(  # type: ignore[call-arg]
        uri, Resource(contents=document, specification=specification)
    )
    resolver = _Resolver(registry, uri)
    info = document.get("info")
    title = _text(info.get("title")) if isinstance(info, Mapping) else None
    servers: list[str] = []
    raw_servers = document.get("servers")
    if isinstance(raw_servers, list):
        for index, server in enumerate(raw_servers):
            if isinstance(server, Mapping) and isinstance(server.get("url"), str):
                servers.append(_server_url(server, uri, f"servers[{index}]"))
    paths = _mapping(document.get("paths", {}), "paths")
    reader = _Reader(document, resolver)
    operations: list[Operation] = []
    skipped: list[str] = []
    for path, raw_item in paths.items():
        if not isinstance(path, str) or not path.startswith("/"):
            raise SpecError(f"paths: {str(path)[:80]!r} does not start with /")
        if "?" in path or "#" in path:
            raise SpecError(
                f"paths: {path[:80]!r} holds a query or a fragment; a path template is a path only "
                "(query parameters are declared as parameters)"
            )
        item, base = resolver.follow(raw_item, uri, f"paths[{path}]")
        item = _mapping(item, f"paths[{path}]")
        shared = reader.parameters(item.get("parameters"), base, f"paths[{path}]")
        for method in METHODS:
            if item.get(method) is None:
                continue
            bundle = _Bundle(resolver, openapi30=version.startswith("3.0"))
            found = reader.operation(path, method, item[method], shared, base, bundle)
            if isinstance(found, str):
                skipped.append(found)
            else:
                operations.append(found)
    return Spec(version, title, tuple(servers), tuple(operations), tuple(skipped))


def _server_url(server: Mapping[str, Any], uri: str, what: str) -> str:
    """A server's URL with its variables at their defaults, made absolute against the document's URI;
    a URL that does not parse is a ``SpecError`` naming the entry (every entry is read, so that a
    spec reads one way whichever server is used)."""
    url = str(server["url"])
    variables = server.get("variables")
    if isinstance(variables, Mapping):
        for name, variable in variables.items():
            if isinstance(variable, Mapping) and isinstance(variable.get("default"), str):
                url = url.replace("{" + str(name) + "}", variable["default"])
    try:
        if not urlsplit(url).scheme and urlsplit(uri).scheme in ("http", "https"):
            url = urljoin(uri, url)
    except ValueError as exc:
        raise SpecError(f"{what}: the url is not a valid URL ({exc})") from None
    return url


__all__ = ["Operation", "Parameter", "Spec", "read_spec"]
