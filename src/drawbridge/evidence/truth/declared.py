"""The declared side of tool-decision truth: what a policy declares, and its digest
(evidence-formats.md §2.5).

Invariant: ``declared_policy_digest`` is ``sha256:`` over the JCS bytes of
``declared_view(policy)`` and of nothing else, and ``declared_view`` reads the
policy through ``normalize_assay_policy`` -- the same normalized view the
verdict gate evaluates -- so the digest binds exactly what the verdict decides.

Theory of operation. The projection keeps the declared-constraint surface only:

* ``version`` (after normalization, ``""``/``"1.0"`` -> ``"2.0"``);
* ``enforcement``: ``{"unconstrained_tools": warn|deny|allow}``, always present;
* ``tools``: always an object, holding only those of the ten lists that are
  present (``null``/absent lists are omitted; an empty list is kept), each
  sorted by the JCS text of its elements so reordering does not move the digest;
* ``schemas``: always an object; each schema normalized *flat*: a top-level
  ``required`` array and each direct ``properties.<name>.enum`` array sorted by
  element JCS, nothing deeper (the reference's stated v0 limitation 7.1, kept
  because a deeper normalization would move the digest away from Assay's).
  ``$defs`` is an ordinary key here.

Everything else -- ``name``, limits, signatures, tool pins, the class taxonomy,
discovery, monitors, the kill switch, the scope/redaction *contracts* -- is
operational and outside the digest. Sorting compares JCS bytes, which orders
like the reference's comparison of JCS strings (UTF-8 byte order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drawbridge.canonical import canonical_bytes, jcs_digest
from drawbridge.evidence.truth.assay_fields import TOOL_LIST_FIELDS
from drawbridge.evidence.truth.assay_policy import normalize_assay_policy

__all__ = ["declared_policy_digest", "declared_view", "project_declared"]


def _sorted_by_canonical(items: list[Any]) -> list[Any]:
    return sorted(items, key=canonical_bytes)


def _normalize_schema_flat(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    required = out.get("required")
    if isinstance(required, list):
        out["required"] = _sorted_by_canonical(required)
    properties = out.get("properties")
    if isinstance(properties, dict):
        props = dict(properties)
        for name, spec in properties.items():
            if isinstance(spec, dict) and isinstance(spec.get("enum"), list):
                props[name] = {**spec, "enum": _sorted_by_canonical(spec["enum"])}
        out["properties"] = props
    return out


def project_declared(normalized: Mapping[str, Any]) -> dict[str, Any]:
    """Project an already-normalized policy (``normalize_assay_policy`` output) onto the declared surface."""
    tools = normalized["tools"]
    return {
        "version": normalized["version"],
        "enforcement": {"unconstrained_tools": normalized["enforcement"]["unconstrained_tools"]},
        "tools": {
            key: _sorted_by_canonical(tools[key])
            for key in TOOL_LIST_FIELDS
            if isinstance(tools.get(key), list)
        },
        "schemas": {name: _normalize_schema_flat(schema) for name, schema in normalized["schemas"].items()},
    }


def declared_view(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The projection that is digested, for a raw parsed Assay policy (or a file reading of one)."""
    return project_declared(normalize_assay_policy(policy))


def declared_policy_digest(policy: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the declared view; equal to Assay's declared-constraint digest."""
    return jcs_digest(declared_view(policy))
