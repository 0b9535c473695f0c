"""The hash-chained trace core: building, line form, verification, checkpoints, vectors.

Expected hashes are recomputed here with hashlib over ``json.dumps(sort_keys=True)``,
which equals RFC 8785 for the ASCII-only, small-integer values these tests use.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.evidence.chain import (
    CHECKPOINT_SCHEMA,
    ENTRY_SCHEMA,
    GENESIS_HASH,
    PROBLEM_CODES,
    ChainFormatError,
    ChainHead,
    checkpoint_bytes,
    entry_line,
    head_of,
    make_checkpoint,
    make_entry,
    parse_checkpoint,
    split_lines,
    verify_chain,
)

VECTOR_DIR = Path(__file__).parent / "vectors" / "chain"
ORDER = ["schema", "seq", "prev_hash", "kind", "at", "body", "entry_hash"]


def independent_hash(entry: dict[str, Any]) -> str:
    without = {k: v for k, v in entry.items() if k != "entry_hash"}
    text = json.dumps(without, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def at(i: int) -> str:
    return f"2026-03-01T12:00:{i:02d}Z"


BODIES: list[tuple[str, dict[str, Any]]] = [
    ("tool_decision", {"agent": "claude", "tool": "fs.read_file", "action": "allow", "rule_index": 0}),
    ("tool_decision", {"agent": "claude", "tool": "fs.write_file", "action": "deny", "rule_index": 2}),
    ("approval_resolved", {"approval": "a-1", "outcome": "approved", "by": "console"}),
    ("policy_edit", {"agent": "claude", "tool": "git.push", "before": "deny", "after": "human_approval"}),
    ("pin_accept", {"server": "github", "tools": ["create_issue", "list_issues"], "n": 2}),
    ("grant_created", {"grant": "g-7", "tools": ["git.*"], "seconds": 600, "nested": {"x": [1, 2, {"y": 3}]}}),
]


def build_lines(n: int = len(BODIES)) -> list[bytes]:
    lines: list[bytes] = []
    head: ChainHead | None = None
    for i in range(n):
        kind, body = BODIES[i % len(BODIES)]
        entry = make_entry(head, kind, at(i), body)
        lines.append(entry_line(entry))
        head = head_of(entry)
    return lines


def problem_of(lines: list[bytes], **kw: Any) -> tuple[str, int, int | None]:
    report = verify_chain(lines, **kw)
    assert not report.ok
    assert report.first_problem is not None
    assert report.first_problem.code in PROBLEM_CODES
    return report.first_problem.code, report.first_problem.line, report.first_problem.seq


# --------------------------------------------------------------------------- building


def test_genesis_hash_is_sha256_prefix_and_64_zeros() -> None:
    assert GENESIS_HASH == "sha256:" + "0" * 64


def test_first_entry_fields_order_and_hash() -> None:
    body = {"tool": "fs.read_file", "action": "allow"}
    entry = make_entry(None, "tool_decision", "2026-03-01T12:00:00Z", body)
    assert list(entry) == ORDER
    assert entry["schema"] == ENTRY_SCHEMA
    assert entry["seq"] == 0
    assert entry["prev_hash"] == GENESIS_HASH
    assert entry["body"] == body
    assert entry["entry_hash"] == independent_hash(entry)


def test_next_entry_links_to_previous() -> None:
    first = make_entry(None, "tool_decision", at(0), {"a": 1})
    second = make_entry(head_of(first), "policy_edit", at(1), {"b": 2})
    assert second["seq"] == 1
    assert second["prev_hash"] == first["entry_hash"]
    assert second["entry_hash"] == independent_hash(second)
    assert second["entry_hash"] != first["entry_hash"]


def test_entry_line_is_compact_fixed_order_with_newline() -> None:
    entry = make_entry(None, "tool_decision", at(0), {"z": 1, "a": [True, None, "s"]})
    line = entry_line(entry)
    h = entry["entry_hash"]
    expected = (
        '{"schema":"drawbridge.trace_entry.v0","seq":0,"prev_hash":"' + GENESIS_HASH + '",'
        '"kind":"tool_decision","at":"2026-03-01T12:00:00Z","body":{"a":[true,null,"s"],"z":1},'
        '"entry_hash":"' + h + '"}\n'
    )
    assert line == expected.encode()


def test_body_is_normalized_through_jcs_so_returned_entry_equals_reread() -> None:
    entry = make_entry(None, "tool_decision", at(0), {"f": 1.0, "big": 2**53 + 1})
    assert entry["body"] == {"f": 1, "big": 2**53}
    reread = json.loads(entry_line(entry))
    assert reread == entry


def test_body_is_copied_not_aliased() -> None:
    body: dict[str, Any] = {"list": [1]}
    entry = make_entry(None, "tool_decision", at(0), body)
    body["list"].append(2)
    assert entry["body"] == {"list": [1]}


@pytest.mark.parametrize("kind", ["", "Tool", "tool decision", "tool-decision", "é", 3])
def test_make_entry_rejects_bad_kind(kind: Any) -> None:
    with pytest.raises(ChainFormatError):
        make_entry(None, kind, at(0), {})


@pytest.mark.parametrize(
    "stamp",
    ["2026-03-01 12:00:00Z", "2026-03-01T12:00:00+00:00", "2026-03-01T12:00:00", "2026-13-01T12:00:00Z", "now"],
)
def test_make_entry_rejects_non_utc_rfc3339(stamp: str) -> None:
    with pytest.raises(ChainFormatError):
        make_entry(None, "tool_decision", stamp, {})


def test_make_entry_accepts_fractional_seconds() -> None:
    assert make_entry(None, "k", "2026-03-01T12:00:00.123456Z", {})["at"] == "2026-03-01T12:00:00.123456Z"


@pytest.mark.parametrize("body", [[], "x", None, {"n": float("nan")}, {"o": object()}])
def test_make_entry_rejects_bodies_without_canonical_object_form(body: Any) -> None:
    with pytest.raises(ChainFormatError):
        make_entry(None, "tool_decision", at(0), body)


def test_entry_line_refuses_reordered_dict() -> None:
    entry = make_entry(None, "k", at(0), {})
    shuffled = {k: entry[k] for k in reversed(ORDER)}
    with pytest.raises(ChainFormatError):
        entry_line(shuffled)


# --------------------------------------------------------------------------- verifying


def test_valid_chain_verifies_and_reports_head() -> None:
    lines = build_lines()
    report = verify_chain(lines)
    last = json.loads(lines[-1])
    assert report.ok and report.first_problem is None
    assert report.entries == len(lines)
    assert report.head == ChainHead(seq=len(lines) - 1, entry_hash=last["entry_hash"])
    assert report.to_dict()["head"] == {"seq": len(lines) - 1, "entry_hash": last["entry_hash"]}


def test_str_lines_are_accepted() -> None:
    assert verify_chain([line.decode() for line in build_lines()]).ok


def test_empty_log_is_valid_with_no_head() -> None:
    report = verify_chain([])
    assert report.ok and report.head is None and report.entries == 0


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_flipping_any_byte_fails_verification(data: st.DataObject) -> None:
    blob = b"".join(build_lines(4))
    pos = data.draw(st.integers(0, len(blob) - 1), label="position")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != blob[pos]), label="byte")
    mutated = blob[:pos] + bytes([new]) + blob[pos + 1 :]
    assert not verify_chain(split_lines(mutated)).ok


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_flipping_one_bit_in_an_entry_is_located_at_that_line(data: st.DataObject) -> None:
    lines = build_lines(4)
    index = data.draw(st.integers(0, len(lines) - 1), label="line")
    pos = data.draw(st.integers(0, len(lines[index]) - 2), label="position")  # not the newline
    bit = data.draw(st.integers(0, 7), label="bit")
    line = bytearray(lines[index])
    line[pos] ^= 1 << bit
    mutated = lines[:index] + [bytes(line)] + lines[index + 1 :]
    report = verify_chain(split_lines(b"".join(mutated)))
    assert not report.ok
    assert report.first_problem is not None and report.first_problem.line == index + 1
    assert report.entries == index


def test_changed_content_is_hash_mismatch() -> None:
    lines = build_lines()
    lines[2] = lines[2].replace(b'"approved"', b'"rejected"')
    assert problem_of(lines) == ("hash_mismatch", 3, 2)


@pytest.mark.parametrize("victim", [1, 2, 4])
def test_deleting_a_middle_line_names_that_seq(victim: int) -> None:
    lines = build_lines()
    del lines[victim]
    code, line, seq = problem_of(lines)
    assert (code, line, seq) == ("seq_gap", victim + 1, victim)
    assert f"entry seq {victim} is missing" in verify_chain(lines).first_problem.message  # type: ignore[union-attr]


def test_deleting_the_first_line_is_a_gap_at_seq_zero() -> None:
    assert problem_of(build_lines()[1:]) == ("seq_gap", 1, 0)


def test_deleting_several_lines_names_the_first_missing() -> None:
    lines = build_lines()
    del lines[1:4]
    code, line, seq = problem_of(lines)
    assert (code, line, seq) == ("seq_gap", 2, 1)
    assert "seq 1..3" in verify_chain(lines).first_problem.message  # type: ignore[union-attr]


def test_swapping_two_lines_is_a_reorder_at_the_first_moved_line() -> None:
    lines = build_lines()
    lines[2], lines[3] = lines[3], lines[2]
    assert problem_of(lines) == ("seq_reorder", 3, 3)


def test_moving_a_line_backwards_is_a_reorder() -> None:
    lines = build_lines()
    moved = lines.pop(1)
    lines.append(moved)
    assert problem_of(lines)[0] == "seq_reorder"


def test_duplicating_a_line_is_named_as_duplicate() -> None:
    lines = build_lines()
    lines.insert(3, lines[2])
    assert problem_of(lines) == ("seq_duplicate", 4, 2)


def test_repeating_an_earlier_line_at_the_end_is_a_reorder() -> None:
    lines = build_lines()
    lines.append(lines[1])
    assert problem_of(lines) == ("seq_reorder", len(lines), 1)


def test_truncating_mid_line_is_a_trailing_partial_line() -> None:
    lines = build_lines()
    blob = b"".join(lines)
    cut = blob[: len(blob) - 20]
    report = verify_chain(split_lines(cut))
    assert report.first_problem is not None
    assert (report.first_problem.code, report.first_problem.line) == ("trailing_partial_line", len(lines))
    assert report.entries == len(lines) - 1


def test_losing_only_the_final_newline_is_a_trailing_partial_line() -> None:
    blob = b"".join(build_lines())
    assert problem_of(split_lines(blob[:-1]))[0] == "trailing_partial_line"


def test_replaced_and_rehashed_entry_breaks_the_next_link() -> None:
    lines = build_lines()
    entry = json.loads(lines[2])
    entry["body"]["outcome"] = "rejected"
    entry["entry_hash"] = independent_hash(entry)
    lines[2] = entry_line(entry)
    assert problem_of(lines) == ("broken_link", 4, 3)


def test_first_entry_must_link_to_genesis() -> None:
    entry = make_entry(ChainHead(seq=0, entry_hash="sha256:" + "1" * 64), "k", at(0), {})
    # seq 1 at line 1: reported as the missing seq 0
    assert problem_of([entry_line(entry)]) == ("seq_gap", 1, 0)
    forged = {**entry, "seq": 0}
    forged["entry_hash"] = independent_hash(forged)
    assert problem_of([entry_line(forged)]) == ("broken_link", 1, 0)


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"not json\n", "malformed_json"),
        (b"\n", "malformed_json"),
        (b"\xff\xfe\n", "malformed_json"),
        (b"[1,2]\n", "not_an_object"),
        (b'{"schema":"drawbridge.trace_entry.v1","seq":0}\n', "wrong_schema"),
        (b'{"seq":0}\n', "missing_field"),
        (b'{"schema":"drawbridge.trace_entry.v0","seq":0}\n', "missing_field"),
    ],
)
def test_shape_problems_at_line_one(line: bytes, code: str) -> None:
    assert problem_of([line])[:2] == (code, 1)


def _forge(**changes: Any) -> bytes:
    """An entry with some field changed and a correct hash, rendered by hand."""
    entry: dict[str, Any] = {
        "schema": ENTRY_SCHEMA,
        "seq": 0,
        "prev_hash": GENESIS_HASH,
        "kind": "k",
        "at": at(0),
        "body": {},
    }
    entry.update(changes)
    entry["entry_hash"] = independent_hash(entry)
    return (json.dumps(entry, separators=(",", ":")) + "\n").encode()


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"extra": 1}, "unknown_field"),
        ({"seq": "0"}, "bad_field"),
        ({"seq": True}, "bad_field"),
        ({"seq": -1}, "bad_field"),
        ({"kind": "Bad Kind"}, "bad_field"),
        ({"at": "yesterday"}, "bad_field"),
        ({"body": [1]}, "bad_field"),
        ({"prev_hash": "sha256:" + "A" * 64}, "bad_hash_form"),
        ({"prev_hash": "sha256:abc"}, "bad_hash_form"),
    ],
)
def test_field_problems(changes: dict[str, Any], code: str) -> None:
    assert problem_of([_forge(**changes)])[:2] == (code, 1)


def test_forge_helper_without_changes_is_valid() -> None:
    assert verify_chain([_forge()]).ok


def test_entry_hash_bad_form_is_reported() -> None:
    entry = json.loads(build_lines(1)[0])
    entry["entry_hash"] = "sha1:" + "0" * 40
    assert problem_of([(json.dumps(entry, separators=(",", ":")) + "\n").encode()])[0] == "bad_hash_form"


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.replace(b'"seq":0,', b'"seq": 0,'),  # whitespace
        lambda b: b.replace(b'"k"', b'"\\u006b"'),  # same string, other spelling
        lambda b: b.replace(b"}\n", b"}\r\n"),  # CRLF
    ],
)
def test_same_content_in_other_bytes_is_noncanonical(edit: Any) -> None:
    line = _forge()
    altered = edit(line)
    assert altered != line and json.loads(altered) == json.loads(line)
    assert problem_of(split_lines(altered))[0] == "noncanonical_line"


def test_line_with_fields_in_other_order_is_noncanonical() -> None:
    entry = json.loads(build_lines(1)[0])
    reordered = {k: entry[k] for k in reversed(ORDER)}
    assert problem_of([(json.dumps(reordered, separators=(",", ":")) + "\n").encode()])[0] == "noncanonical_line"


def test_verification_stops_at_first_problem() -> None:
    lines = build_lines()
    lines[1] = lines[1].replace(b'"deny"', b'"allo"')
    del lines[4]
    assert problem_of(lines) == ("hash_mismatch", 2, 1)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_shape_and_round_trip() -> None:
    head = ChainHead(seq=4, entry_hash="sha256:" + "ab" * 32)
    cp = make_checkpoint(head, at(9))
    assert cp == {"schema": CHECKPOINT_SCHEMA, "seq": 4, "entry_hash": head.entry_hash, "at": at(9)}
    assert list(cp) == ["schema", "seq", "entry_hash", "at"]
    assert parse_checkpoint(json.loads(checkpoint_bytes(cp))) == head
    assert checkpoint_bytes(cp) == (
        '{"schema":"drawbridge.trace_checkpoint.v0","seq":4,"entry_hash":"' + head.entry_hash + '",'
        '"at":"2026-03-01T12:00:09Z"}\n'
    ).encode()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.pop("seq"),
        lambda c: c.update(schema="drawbridge.trace_entry.v0"),
        lambda c: c.update(seq=-1),
        lambda c: c.update(entry_hash="sha256:xyz"),
        lambda c: c.update(at="later"),
        lambda c: c.update(signature="abc"),
    ],
)
def test_parse_checkpoint_refuses_other_shapes(mutate: Any) -> None:
    cp = make_checkpoint(ChainHead(seq=1, entry_hash=GENESIS_HASH), at(0))
    mutate(cp)
    with pytest.raises(ChainFormatError):
        parse_checkpoint(cp)


def test_intact_log_matches_checkpoint_at_head_and_before() -> None:
    lines = build_lines()
    for i, line in enumerate(lines):
        head = ChainHead(seq=i, entry_hash=json.loads(line)["entry_hash"])
        assert verify_chain(lines, expected_head=head).ok


def test_cut_tail_is_invisible_without_checkpoint_and_truncated_with_it() -> None:
    lines = build_lines()
    head = verify_chain(lines).head
    assert head is not None
    cut = lines[:-2]
    assert verify_chain(cut).ok
    code, line, seq = problem_of(cut, expected_head=head)
    assert (code, line, seq) == ("truncated", len(cut) + 1, len(cut))
    assert f"seq {head.seq}" in verify_chain(cut, expected_head=head).first_problem.message  # type: ignore[union-attr]


def test_empty_log_with_checkpoint_is_truncated() -> None:
    assert problem_of([], expected_head=ChainHead(seq=0, entry_hash=GENESIS_HASH))[0] == "truncated"


def test_rewritten_tail_disagrees_with_checkpoint() -> None:
    lines = build_lines()
    head = verify_chain(lines).head
    assert head is not None
    # Rewrite from seq 3 on: a self-consistent chain that is not the one checkpointed.
    prev = ChainHead(seq=2, entry_hash=json.loads(lines[2])["entry_hash"])
    rewritten = lines[:3]
    for i in range(3, len(lines)):
        entry = make_entry(prev, "tool_decision", at(i), {"forged": i})
        rewritten.append(entry_line(entry))
        prev = head_of(entry)
    assert verify_chain(rewritten).ok
    assert problem_of(rewritten, expected_head=head) == ("checkpoint_mismatch", len(lines), head.seq)


# --------------------------------------------------------------------------- vectors


def generate_vectors() -> dict[str, bytes]:
    """Every committed file under tests/vectors/chain, with expectations fixed by construction."""
    valid = build_lines()
    n = len(valid)
    files: dict[str, list[bytes]] = {"valid.ndjson": valid}
    expected: dict[str, dict[str, Any]] = {
        "valid.ndjson": {"ok": True, "entries": n, "head_seq": n - 1}
    }

    files["deleted-middle.ndjson"] = valid[:2] + valid[3:]
    expected["deleted-middle.ndjson"] = {"ok": False, "entries": 2, "code": "seq_gap", "line": 3, "seq": 2}

    files["swapped.ndjson"] = valid[:1] + [valid[2], valid[1]] + valid[3:]
    expected["swapped.ndjson"] = {"ok": False, "entries": 1, "code": "seq_reorder", "line": 2, "seq": 2}

    files["duplicated.ndjson"] = valid[:4] + [valid[3]] + valid[4:]
    expected["duplicated.ndjson"] = {"ok": False, "entries": 4, "code": "seq_duplicate", "line": 5, "seq": 3}

    files["altered-body.ndjson"] = valid[:1] + [valid[1].replace(b'"deny"', b'"allow"')] + valid[2:]
    expected["altered-body.ndjson"] = {"ok": False, "entries": 1, "code": "hash_mismatch", "line": 2, "seq": 1}

    relinked = json.loads(valid[2])
    relinked["body"]["outcome"] = "denied"
    relinked["entry_hash"] = independent_hash(relinked)
    files["relinked.ndjson"] = valid[:2] + [entry_line(relinked)] + valid[3:]
    expected["relinked.ndjson"] = {"ok": False, "entries": 3, "code": "broken_link", "line": 4, "seq": 3}

    files["partial-tail.ndjson"] = valid[:-1] + [valid[-1][: len(valid[-1]) // 2]]
    expected["partial-tail.ndjson"] = {
        "ok": False, "entries": n - 1, "code": "trailing_partial_line", "line": n, "seq": None
    }

    files["cut-tail.ndjson"] = valid[:-2]
    expected["cut-tail.ndjson"] = {"ok": True, "entries": n - 2, "head_seq": n - 3}
    expected["cut-tail.ndjson+checkpoint.json"] = {
        "ok": False, "entries": n - 2, "code": "truncated", "line": n - 1, "seq": n - 2
    }
    expected["valid.ndjson+checkpoint.json"] = {"ok": True, "entries": n, "head_seq": n - 1}

    last = json.loads(valid[-1])
    checkpoint = make_checkpoint(ChainHead(seq=last["seq"], entry_hash=last["entry_hash"]), at(59))

    out = {name: b"".join(lines) for name, lines in files.items()}
    out["checkpoint.json"] = (json.dumps(checkpoint, indent=2, ensure_ascii=False) + "\n").encode()
    out["expected.json"] = (json.dumps(expected, indent=2, ensure_ascii=False) + "\n").encode()
    return out


def test_vectors_have_not_drifted() -> None:
    generated = generate_vectors()
    if os.environ.get("DRAWBRIDGE_UPDATE_VECTORS") == "1":
        VECTOR_DIR.mkdir(parents=True, exist_ok=True)
        for name, data in generated.items():
            (VECTOR_DIR / name).write_bytes(data)
    committed = {p.name: p.read_bytes() for p in VECTOR_DIR.iterdir() if p.is_file()}
    assert committed == generated


def test_vectors_recompute_from_committed_bytes() -> None:
    expected = json.loads((VECTOR_DIR / "expected.json").read_bytes())
    checkpoint = parse_checkpoint(json.loads((VECTOR_DIR / "checkpoint.json").read_bytes()))
    assert expected, "no expectations"
    for key, want in expected.items():
        name, _, cp = key.partition("+")
        report = verify_chain(split_lines((VECTOR_DIR / name).read_bytes()), expected_head=checkpoint if cp else None)
        assert report.ok is want["ok"], key
        assert report.entries == want["entries"], key
        if want["ok"]:
            assert report.head is not None and report.head.seq == want["head_seq"], key
        else:
            problem = report.first_problem
            assert problem is not None
            assert (problem.code, problem.line, problem.seq) == (want["code"], want["line"], want["seq"]), key


def test_valid_vector_hashes_recomputed_independently() -> None:
    prev = GENESIS_HASH
    lines = split_lines((VECTOR_DIR / "valid.ndjson").read_bytes())
    for seq, line in enumerate(lines):
        entry = json.loads(line)
        assert list(entry) == ORDER
        assert entry["seq"] == seq
        assert entry["prev_hash"] == prev
        assert entry["entry_hash"] == independent_hash(entry)
        prev = entry["entry_hash"]
    checkpoint = json.loads((VECTOR_DIR / "checkpoint.json").read_bytes())
    assert checkpoint["entry_hash"] == prev and checkpoint["seq"] == len(lines) - 1


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(
        st.text(max_size=6),
        st.recursive(st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False,
                     allow_infinity=False) | st.text(max_size=10),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                     max_leaves=10),
        max_size=6,
    ),
    seq=st.integers(min_value=0, max_value=10**9),
)
def test_build_entry_assembles_the_same_bytes_as_the_generic_path(body, seq):
    from drawbridge.canonical import jcs_digest
    from drawbridge.evidence.chain import build_entry

    prev = ChainHead(seq=seq, entry_hash="sha256:" + "ab" * 32)
    entry, line = build_entry(prev, "tool_decision", "2026-11-30T12:00:00.123456Z", body)
    without_hash = {k: v for k, v in entry.items() if k != "entry_hash"}
    assert entry["entry_hash"] == jcs_digest(without_hash)
    assert line == entry_line(entry)
