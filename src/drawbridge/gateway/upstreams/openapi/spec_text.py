"""Reading an OpenAPI document's text, and the files a spec read from a file may refer to.

Invariant: a document is read one way and never quoted back. JSON or YAML with no key given twice (a
key given twice is named by the key alone, never its values, which a file beside the spec may hold as
secrets) and no number that is not a finite double (``NaN``, ``Infinity``, ``1e400``, YAML's ``.nan``
and ``.inf``: no tools/list that carries one could be encoded as JSON), named by its JSON Pointer;
YAML is held to the configuration's bounds (``strict_yaml.check_bounds``: depth, values
counting aliases) before it is built; a document is at most ``MAX_SPEC_BYTES``. A spec read from a file
may refer to files in its own directory or below it, once every symlink is resolved
(``file_retriever``); a spec fetched by URL may only refer inside itself (``refuse_retrieval``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from referencing import Resource
from referencing.jsonschema import DRAFT202012
from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import YAMLError

from drawbridge.canonical import DuplicateKeyError, unique_object
from drawbridge.gateway.upstreams.http_link import safe_url
from drawbridge.policy.schemas import pointer_of
from drawbridge.policy.strict_yaml import YamlProblem, check_bounds, yaml_problem

MAX_SPEC_BYTES: Final = 16 * 1024 * 1024


class SpecError(ValueError):
    """The document cannot be served: the message says where and why."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    try:
        return unique_object(pairs)
    except DuplicateKeyError as exc:
        raise SpecError(f"the key {exc.key!r} is given twice in one object") from None


class _SafeConstructor(SafeConstructor):
    """ruamel's safe construction, naming a key given twice by the key alone (ruamel's own error
    quotes both values, which a file beside the spec may hold as secrets)."""

    def check_mapping_key(self, node: Any, key_node: Any, mapping: Any, key: Any, value: Any) -> bool:
        if key in mapping:
            raise YamlProblem(key_node.start_mark.line + 1, f"the key {str(key)[:80]!r} is given twice in one object")
        return True


def _refuse_non_finite(document: Any) -> None:
    """A ``SpecError`` naming (by JSON Pointer) a number no JSON encoder writes: NaN, an infinity, or a
    number beyond a double that reads as one."""
    pending: list[tuple[Any, list[Any]]] = [(document, [])]
    while pending:
        value, path = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(
                f"the number at {pointer_of(path) or '/'} is not a finite double "
                "(NaN, Infinity, or too large), which JSON cannot carry"
            )
        if isinstance(value, Mapping):
            pending.extend((item, [*path, key]) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, [*path, index]) for index, item in enumerate(value))


def parse_text(text: str, where: str) -> Any:
    """A JSON or YAML document; a key given twice is an error (it could be read two ways), as is a
    number that is not a finite double. A problem is named by its line or its JSON Pointer, never by
    quoting the text."""
    document = _parse(text, where)
    try:
        _refuse_non_finite(document)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    return document


def _parse(text: str, where: str) -> Any:
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            return json.loads(text, object_pairs_hook=_no_duplicates)
        check_bounds(text)  # the configuration's bounds: an alias bomb is refused before it expands
        yaml = YAML(typ="safe", pure=True)
        yaml.Constructor = _SafeConstructor
        try:
            return yaml.load(text)
        except YAMLError as exc:
            raise yaml_problem(exc) from None
        except (ValueError, TypeError, OverflowError):  # ``!!int abc``: ruamel's int() fails, quoting it
            raise YamlProblem(None, "invalid YAML: a value does not read as its tag says") from None
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except YamlProblem as exc:
        raise SpecError(f"{where}:{exc.line or 1}: {exc.problem}") from None
    except RecursionError:
        raise SpecError(f"{where}: the document nests too deeply") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None


def read_file(path: str) -> tuple[Any, str]:
    """The document in a file, and its URI."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read the OpenAPI document {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"the OpenAPI document {path} is larger than {MAX_SPEC_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"the OpenAPI document {path} is not UTF-8 text") from None
    return parse_text(text, path), file.resolve().as_uri()


def file_retriever(root: str) -> Callable[[str], Resource[Any]]:
    """Retrieve documents a file spec refers to: files in the spec's own directory or below it, once
    every symlink is resolved, so that no reference reads (and shows agents) a file elsewhere."""
    directory = Path(unquote(urlsplit(root).path)).resolve().parent

    def retrieve(uri: str) -> Resource[Any]:
        parts = urlsplit(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise SpecError(f"a reference to {uri[:200]} leaves the spec's files; only files beside it are read")
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(directory):
            raise SpecError(
                f"a reference to {path} leaves the spec's directory {directory}; only files in it are read"
            )
        document, _ = read_file(str(path))
        return Resource(contents=document, specification=DRAFT202012)

    return retrieve


def refuse_retrieval(uri: str) -> Resource[Any]:
    raise SpecError(
        f"a reference to {safe_url(uri)} leaves the document; a spec read by URL may only refer inside itself"
    )


__all__ = ["MAX_SPEC_BYTES", "SpecError", "file_retriever", "parse_text", "read_file", "refuse_retrieval"]
