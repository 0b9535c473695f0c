"""Verifiers that recompute tool-decision-truth evidence from bytes (evidence-formats.md §2, 5.3).

Invariant: a report says ``ok`` only when every expectation it was handed has
been recomputed here, from the document alone, and agrees. Nothing is taken on
trust from the document's own claims; a section that is missing, malformed or
empty is a failed item, never a skipped one.

Theory of operation. Two entry points, both pure (parsed JSON in, a report out):

``verify_tdt_document(doc)`` checks an ``assay.tool_decision_truth.vectors.v0``
conformance document:

- ``policy:<name>``         the declared policy reads and digests;
- ``case:<id>``             each decision verdict and the run verdict recompute
                            (``args: null`` means "not captured");
- ``run_verdict_unit:<id>`` the run lattice recomputes;
- ``carrier:<id>``          the carrier passes the import gate (no raw argument
                            key anywhere, digest forms, key id, observed-input
                            digest recomputes, vocabularies, decision identity)
                            and cites the declared digest of its named policy;
- ``pack_row:<id>``         the row verifies against the carrier it names;
- ``negative_pack_row:<id>`` the row FAILS against the carrier it names, and at
                            the check named by ``expected_failure`` when the
                            entry carries one (our vectors do; Assay's do not).

``verify_carriers(carriers, rows)`` checks a carrier NDJSON stream as the live
producer writes it, optionally with recipe rows, pairing each row with the
carrier it cites by content digest (as the bundle verifier of 5.3 does).

Each report is ``{schema, ok, ..., checks: [{id, ok, detail}]}``. A verifier
must not crash on hostile input, so each item's recomputation runs under its
own guard and an unexpected exception fails that item with its type named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from drawbridge.canonical import is_sha256_digest
from drawbridge.evidence.truth.carrier import carrier_content_digest, is_i64, validate_carrier
from drawbridge.evidence.truth.declared import declared_policy_digest as policy_digest
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.pack import verify_recipe_row
from drawbridge.evidence.truth.verdict import decision_verdict, run_verdict

VECTORS_SCHEMA = "assay.tool_decision_truth.vectors.v0"
DOCUMENT_REPORT_SCHEMA = "drawbridge.tool_decision_truth.vectors_report.v0"
CARRIERS_REPORT_SCHEMA = "drawbridge.tool_decision_truth.carriers_report.v0"
CLAIMS_NOT_MADE: tuple[str, ...] = (
    "policy_correctness",
    "intent_or_maliciousness",
    "runtime_enforcement",
    "tool_result_truth",
)

_LIST_SECTIONS: tuple[tuple[str, bool], ...] = (
    # (section, must be non-empty)
    ("cases", True),
    ("run_verdict_units", False),
    ("carriers", True),
    ("pack_rows", True),
    ("negative_pack_rows", True),
)


class _ItemFailure(Exception):
    """One item's expectation does not recompute; the message is the report detail."""


def _check(checks: list[dict[str, Any]], item_id: str, run: Callable[[], str]) -> bool:
    """Run one item's recomputation and record ``{id, ok, detail}``; return ok."""
    try:
        detail, ok = run(), True
    except _ItemFailure as failure:
        detail, ok = str(failure), False
    except Exception as exc:  # noqa: BLE001 -- hostile input must fail the item, not the verifier
        detail, ok = f"cannot be recomputed ({type(exc).__name__}: {exc})", False
    checks.append({"id": item_id, "ok": ok, "detail": detail})
    return ok


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise _ItemFailure(detail)


def _entry_id(entry: Any, index: int) -> str:
    if isinstance(entry, Mapping) and isinstance(entry.get("id"), str):
        return entry["id"]
    return f"#{index}"


def _report(schema: str, checks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"schema": schema, "ok": bool(checks) and all(c["ok"] for c in checks), **extra, "checks": checks}


# --- the conformance document ---------------------------------------------------------------


def _observed_args(decision: Mapping[str, Any]) -> Any:
    """The vectors' encoding: ``args`` null or absent means the arguments were not captured."""
    args = decision.get("args")
    return None if args is None else args


def _recompute_case(case: Any, policies: Mapping[str, Any]) -> str:
    _require(isinstance(case, Mapping), "case is not an object")
    policy_name = case.get("policy")
    _require(isinstance(policy_name, str) and policy_name in policies, "case names no known policy")
    policy = policies[policy_name]
    observed = case.get("observed")
    expected = case.get("expected")
    _require(isinstance(observed, list), "observed is not an array")
    _require(isinstance(expected, Mapping), "expected is not an object")
    verdicts: list[str] = []
    orders: list[int] = []
    for index, decision in enumerate(observed):
        _require(isinstance(decision, Mapping), f"observed[{index}] is not an object")
        tool = decision.get("tool_name")
        identity = decision.get("identity_state")
        order = decision.get("order")
        _require(isinstance(tool, str), f"observed[{index}].tool_name is not a string")
        _require(isinstance(identity, str), f"observed[{index}].identity_state is not a string")
        _require(is_i64(order), f"observed[{index}].order is not an integer")
        evidence = Evidence.from_json(decision.get("evidence"))
        verdicts.append(decision_verdict(policy, tool, _observed_args(decision), identity, evidence))
        orders.append(order)
    want_decisions = expected.get("decisions")
    _require(
        verdicts == want_decisions,
        f"decisions recompute to {verdicts}, document expects {want_decisions}",
    )
    run = run_verdict(verdicts, orders)
    _require(
        run == expected.get("run_verdict"),
        f"run verdict recomputes to {run!r}, document expects {expected.get('run_verdict')!r}",
    )
    return f"decisions {verdicts}, run verdict {run}"


def _recompute_run_unit(unit: Any) -> str:
    _require(isinstance(unit, Mapping), "unit is not an object")
    verdicts, orders = unit.get("verdicts"), unit.get("orders")
    _require(
        isinstance(verdicts, list) and all(isinstance(v, str) for v in verdicts),
        "verdicts is not an array of strings",
    )
    _require(
        isinstance(orders, list) and all(is_i64(o) for o in orders), "orders is not an array of integers"
    )
    run = run_verdict(verdicts, orders)
    _require(
        run == unit.get("expected"),
        f"run verdict recomputes to {run!r}, document expects {unit.get('expected')!r}",
    )
    return f"run verdict {run}"


def _recompute_carrier(entry: Any, policy_digests: Mapping[str, str]) -> str:
    _require(isinstance(entry, Mapping), "entry is not an object")
    carrier = entry.get("carrier")
    problems = validate_carrier(carrier)
    _require(not problems, "; ".join(problems))
    policy_name = entry.get("policy")
    _require(isinstance(policy_name, str) and policy_name in policy_digests, "carrier names no known policy")
    _require(
        carrier["declared_policy_digest"] == policy_digests[policy_name],
        f"declared_policy_digest is not the digest of policy {policy_name!r}",
    )
    return f"content {carrier_content_digest(carrier)}"


def _row_against(entry: Any, carriers: Mapping[str, Any]) -> tuple[bool, str | None]:
    _require(isinstance(entry, Mapping), "entry is not an object")
    carrier_id = entry.get("carrier_id")
    _require(isinstance(carrier_id, str) and carrier_id in carriers, "row names no known carrier")
    verdict = entry.get("run_verdict")
    _require(isinstance(verdict, str), "run_verdict is not a string")
    return verify_recipe_row(entry.get("row"), carriers[carrier_id], verdict)


def _recompute_pack_row(entry: Any, carriers: Mapping[str, Any]) -> str:
    ok, failed = _row_against(entry, carriers)
    _require(ok, f"row does not verify ({failed})")
    return "row verifies against its carrier"


def _recompute_negative_row(entry: Any, carriers: Mapping[str, Any]) -> str:
    ok, failed = _row_against(entry, carriers)
    _require(not ok, "tampered row verifies; it must fail closed")
    expected = entry.get("expected_failure")
    if expected is not None:
        check = (failed or "").split(":", 1)[0]
        _require(check == expected, f"row fails at {check!r}, document expects {expected!r} ({failed})")
    return f"fails closed ({failed})"


def _unique_ids(checks: list[dict[str, Any]], section: str, entries: Sequence[Any]) -> None:
    ids = [_entry_id(e, i) for i, e in enumerate(entries)]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        checks.append({"id": f"{section}_ids", "ok": False, "detail": f"duplicate ids {duplicates}"})


def verify_tdt_document(doc: Any) -> dict[str, Any]:
    """Recompute every expectation of a vectors document; see the module docstring."""
    checks: list[dict[str, Any]] = []
    if not isinstance(doc, Mapping):
        checks.append({"id": "document", "ok": False, "detail": "document is not a JSON object"})
        return _report(DOCUMENT_REPORT_SCHEMA, checks)
    schema_ok = doc.get("schema") == VECTORS_SCHEMA
    detail = VECTORS_SCHEMA if schema_ok else f"schema is not {VECTORS_SCHEMA!r}"
    checks.append({"id": "schema", "ok": schema_ok, "detail": detail})

    policies = doc.get("policies")
    if not isinstance(policies, Mapping) or not policies:
        checks.append({"id": "policies", "ok": False, "detail": "policies is not a non-empty object"})
        policies = {}
    policy_digests: dict[str, str] = {}
    for name, policy in policies.items():

        def digest_policy(name: str = name, policy: Any = policy) -> str:
            digest = policy_digest(policy)
            policy_digests[name] = digest
            return f"declared {digest}"

        _check(checks, f"policy:{name}", digest_policy)
    readable = {name: policies[name] for name in policy_digests}

    sections: dict[str, list[Any]] = {}
    for section, non_empty in _LIST_SECTIONS:
        value = doc.get(section)
        if not isinstance(value, list) or (non_empty and not value):
            kind = "a non-empty array" if non_empty else "an array"
            checks.append({"id": section, "ok": False, "detail": f"{section} is not {kind}"})
            value = []
        sections[section] = value
        _unique_ids(checks, section, value)

    for i, case in enumerate(sections["cases"]):
        _check(checks, f"case:{_entry_id(case, i)}", lambda case=case: _recompute_case(case, readable))
    for i, unit in enumerate(sections["run_verdict_units"]):
        _check(checks, f"run_verdict_unit:{_entry_id(unit, i)}", lambda unit=unit: _recompute_run_unit(unit))

    carriers: dict[str, Any] = {}
    for i, entry in enumerate(sections["carriers"]):
        item_id = _entry_id(entry, i)
        if _check(
            checks, f"carrier:{item_id}", lambda entry=entry: _recompute_carrier(entry, policy_digests)
        ):
            carriers[item_id] = entry["carrier"]
    for i, entry in enumerate(sections["pack_rows"]):
        _check(
            checks,
            f"pack_row:{_entry_id(entry, i)}",
            lambda entry=entry: _recompute_pack_row(entry, carriers),
        )
    for i, entry in enumerate(sections["negative_pack_rows"]):
        _check(
            checks,
            f"negative_pack_row:{_entry_id(entry, i)}",
            lambda entry=entry: _recompute_negative_row(entry, carriers),
        )
    return _report(DOCUMENT_REPORT_SCHEMA, checks)


# --- a carrier stream, with optional recipe rows ------------------------------------------


def verify_carriers(
    carriers: Sequence[Any],
    rows: Sequence[Any] | None = None,
    *,
    declared_policy_digest: str | None = None,
) -> dict[str, Any]:
    """Check each carrier at the import gate and, when rows are given, pair and verify each row.

    ``carriers`` are the parsed lines of a carrier NDJSON file, in file order (ids
    ``carrier_<index>``). ``declared_policy_digest``, when given, must be the digest every
    carrier cites. Rows cite carriers by content digest; a row citing no carrier, two rows
    citing one carrier, and two carriers with one content digest all fail.
    """
    checks: list[dict[str, Any]] = []
    if declared_policy_digest is not None and not is_sha256_digest(declared_policy_digest):
        checks.append({"id": "declared_policy_digest", "ok": False, "detail": "expected digest is malformed"})
    if not carriers:
        checks.append({"id": "carriers_present", "ok": False, "detail": "no carriers to verify"})

    by_content: dict[str, Any] = {}
    for index, carrier in enumerate(carriers):

        def check_carrier(carrier: Any = carrier) -> str:
            problems = validate_carrier(carrier)
            _require(not problems, "; ".join(problems))
            if declared_policy_digest is not None:
                _require(
                    carrier["declared_policy_digest"] == declared_policy_digest,
                    "declared_policy_digest is not the expected policy digest",
                )
            content = carrier_content_digest(carrier)
            _require(content not in by_content, f"duplicate carrier content digest {content}")
            by_content[content] = carrier
            return f"content {content}"

        _check(checks, f"carrier_{index}", check_carrier)

    verified_rows = 0
    if rows is not None:
        if not rows:
            checks.append({"id": "rows_present", "ok": False, "detail": "no recipe rows to verify"})
        cited: set[str] = set()
        for index, row in enumerate(rows):

            def check_row(row: Any = row) -> str:
                envelope = row.get("evidence_ref") if isinstance(row, Mapping) else None
                digest = envelope.get("digest") if isinstance(envelope, Mapping) else None
                _require(isinstance(digest, str), "row has no evidence_ref.digest to pair on")
                _require(digest not in cited, f"more than one row cites carrier content digest {digest}")
                cited.add(digest)
                _require(digest in by_content, f"no valid carrier has content digest {digest}")
                verdict = row.get("run_verdict")
                verdict = verdict if isinstance(verdict, str) else ""
                ok, failed = verify_recipe_row(row, by_content[digest], verdict)
                _require(ok, f"row does not verify ({failed})")
                return "row coheres with the carrier it cites"

            if _check(checks, f"row_{index}", check_row):
                verified_rows += 1

    return _report(
        CARRIERS_REPORT_SCHEMA,
        checks,
        carrier_count=len(carriers),
        row_count=0 if rows is None else len(rows),
        verified_rows=verified_rows,
        claims_not_made=list(CLAIMS_NOT_MADE),
    )
