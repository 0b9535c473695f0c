"""``drawbridge evidence``, run as a real subprocess over files written in tmp_path.

Exit codes: 0 verified, 1 verification failed, 2 usage error or unreadable input.
Expected digests are recomputed inline with hashlib (JCS equals ``json.dumps(sort_keys=True)``
for the ASCII, small-integer documents used here).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import scaled

from drawbridge.evidence.chain import ChainHead, entry_line, head_of, make_checkpoint, make_entry

AT = "2026-03-01T12:00:00Z"


def run(*args: str, stdin: bytes = b"", cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "drawbridge", *args],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        timeout=scaled(60),
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONIOENCODING": "utf-8",
             **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ}},  # the code under test
    )


def out(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode("utf-8")


def err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode("utf-8")


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def jcs(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --------------------------------------------------------------------------- entry point


def test_console_script_and_module_agree() -> None:
    script = Path(sys.executable).parent / "drawbridge"
    assert script.exists(), "the drawbridge console script is installed with the package"
    by_script = subprocess.run([str(script), "--help"], capture_output=True, timeout=scaled(60))
    by_module = run("--help")
    assert by_script.returncode == by_module.returncode == 0
    assert by_script.stdout == by_module.stdout
    assert b"evidence" in by_module.stdout


def test_evidence_help_documents_exit_codes() -> None:
    result = run("evidence", "--help")
    assert result.returncode == 0
    text = out(result)
    for line in ("0  verified", "1  verification failed", "2  usage error or unreadable input"):
        assert line in text
    for sub in ("canonicalize", "target-hash", "verify-tdt", "verify-side-effects", "verify-chain"):
        assert sub in text
        sub_help = run("evidence", sub, "--help")
        assert sub_help.returncode == 0 and "Exit codes" in out(sub_help), sub


def test_unknown_subcommand_is_usage_error() -> None:
    result = run("evidence", "no-such-thing")
    assert result.returncode == 2
    assert "No such command" in err(result)


# --------------------------------------------------------------------------- canonicalize


def test_canonicalize_prints_exact_bytes_without_newline(tmp_path: Path) -> None:
    doc = {"b": 1, "a": [True, None, "x"], "c": {"z": 0, "y": "é"}}
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc, indent=4), encoding="utf-8")
    result = run("evidence", "canonicalize", str(path))
    assert result.returncode == 0
    assert result.stdout == jcs(doc)
    assert not result.stdout.endswith(b"\n")


def test_canonicalize_reads_stdin_and_normalizes_numbers() -> None:
    result = run("evidence", "canonicalize", stdin=b'{"n": 1.0, "e": 1E2, "s": "\\u0041"}')
    assert result.returncode == 0
    assert result.stdout == b'{"e":100,"n":1,"s":"A"}'
    dash = run("evidence", "canonicalize", "-", stdin=b"[1, 2]")
    assert dash.stdout == b"[1,2]"


def test_canonicalize_json_format_gives_digest(tmp_path: Path) -> None:
    doc = {"k": "v", "a": 2}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    result = run("evidence", "canonicalize", str(path), "--format", "json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report == {"canonical": jcs(doc).decode(), "digest": sha(jcs(doc))}


@pytest.mark.parametrize("doc", [b'{"a":1,"a":2}', b'[{"x":{"a":1,"b":0,"a":1}}]', b'\xef\xbb\xbf{"a":1,"a":2}'])
def test_canonicalize_refuses_a_key_given_twice(doc: bytes) -> None:
    """RFC 8785 takes I-JSON only: keeping the first or the last value would give two digests for one text."""
    result = run("evidence", "canonicalize", "-", stdin=doc)
    assert result.returncode == 2, out(result)
    assert result.stdout == b""
    assert 'the key "a" is given twice in one object' in err(result)


@pytest.mark.parametrize("bad", [b'{"a": ', b"NaN", b'{"a": Infinity}', b"", b"\xff"])
def test_canonicalize_invalid_json_is_exit_2(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(bad)
    result = run("evidence", "canonicalize", str(path))
    assert result.returncode == 2
    assert result.stdout == b""
    assert str(path) in err(result)


def test_canonicalize_missing_file_is_exit_2(tmp_path: Path) -> None:
    result = run("evidence", "canonicalize", str(tmp_path / "absent.json"))
    assert result.returncode == 2
    assert "cannot read" in err(result)


# --------------------------------------------------------------------------- target-hash


def test_target_hash_follows_the_spec() -> None:
    result = run("evidence", "target-hash", "workspace", "  Acme-Corp \t")
    assert result.returncode == 0
    expected = sha(b"assay.tool_target.v0:workspace:acme-corp")
    assert out(result) == expected + "\n"


def test_target_hash_from_stdin_and_json_never_echoes_value() -> None:
    secret = "U0SECRETPRINCIPAL"
    result = run("evidence", "target-hash", "slack_principal", "-", "--format", "json", stdin=secret.encode() + b"\n")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report == {
        "domain": "slack_principal",
        "target_hash": sha(b"assay.tool_target.v0:slack_principal:u0secretprincipal"),
    }
    assert secret not in out(result) and secret.lower() not in out(result)


def test_target_hash_unknown_domain_is_exit_2() -> None:
    result = run("evidence", "target-hash", "no_such_domain", "value")
    assert result.returncode == 2
    assert "no_such_domain" in err(result) and "workspace_principal" in err(result)
    assert result.stdout == b""


# --------------------------------------------------------------------------- verify-chain


def write_trace(path: Path, n: int = 5) -> list[bytes]:
    lines: list[bytes] = []
    head: ChainHead | None = None
    for i in range(n):
        entry = make_entry(head, "tool_decision", AT, {"i": i, "tool": f"t{i}"})
        lines.append(entry_line(entry))
        head = head_of(entry)
    path.write_bytes(b"".join(lines))
    return lines


def test_verify_chain_ok_table_and_json(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    lines = write_trace(trace)
    last_hash = json.loads(lines[-1])["entry_hash"]
    table = run("evidence", "verify-chain", str(trace))
    assert table.returncode == 0
    assert "VERIFIED" in out(table) and last_hash in out(table)
    machine = run("evidence", "verify-chain", str(trace), "--format", "json")
    assert machine.returncode == 0
    report = json.loads(machine.stdout)
    assert report["ok"] is True and report["entries"] == 5
    assert report["head"] == {"seq": 4, "entry_hash": last_hash}
    assert report["first_problem"] is None


def test_verify_chain_deleted_line_is_exit_1_naming_seq(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    lines = write_trace(trace)
    trace.write_bytes(b"".join(lines[:2] + lines[3:]))
    table = run("evidence", "verify-chain", str(trace))
    assert table.returncode == 1
    assert "seq_gap" in out(table) and "entry seq 2 is missing" in out(table) and "FAILED" in out(table)
    report = json.loads(run("evidence", "verify-chain", str(trace), "--format", "json").stdout)
    assert report["ok"] is False
    assert report["first_problem"]["code"] == "seq_gap"
    assert report["first_problem"]["seq"] == 2 and report["first_problem"]["line"] == 3


def test_verify_chain_altered_byte_is_exit_1(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    write_trace(trace)
    data = bytearray(trace.read_bytes())
    data[data.index(b'"t3"') + 2] = ord("9")
    trace.write_bytes(bytes(data))
    result = run("evidence", "verify-chain", str(trace), "--format", "json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["first_problem"]["code"] == "hash_mismatch"


def test_verify_chain_with_checkpoint(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    lines = write_trace(trace)
    last = json.loads(lines[-1])
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(json.dumps(make_checkpoint(ChainHead(last["seq"], last["entry_hash"]), AT)))
    assert run("evidence", "verify-chain", str(trace), "--expected-head", str(checkpoint)).returncode == 0
    trace.write_bytes(b"".join(lines[:3]))
    assert run("evidence", "verify-chain", str(trace)).returncode == 0  # a cut tail alone is invisible
    result = run("evidence", "verify-chain", str(trace), "--expected-head", str(checkpoint), "--format", "json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["first_problem"]["code"] == "truncated"
    assert report["expected_head"] == {"seq": 4, "entry_hash": last["entry_hash"]}
    table = run("evidence", "verify-chain", str(trace), "--expected-head", str(checkpoint))
    assert "truncated" in out(table) and "cut from the end" in out(table)


def test_evidence_checkpoint_writes_the_head_verify_chain_takes(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    lines = write_trace(trace)
    head = tmp_path / "head.json"
    made = run("evidence", "checkpoint", str(trace), "--out", str(head))
    assert made.returncode == 0, err(made)
    written = json.loads(head.read_text())
    assert written["seq"] == 4 and written["entry_hash"] == json.loads(lines[-1])["entry_hash"]
    assert run("evidence", "verify-chain", str(trace), "--expected-head", str(head)).returncode == 0
    trace.write_bytes(b"".join(lines[:3]))  # cut after the head was noted
    cut = run("evidence", "verify-chain", str(trace), "--expected-head", str(head), "--format", "json")
    assert cut.returncode == 1 and json.loads(cut.stdout)["first_problem"]["code"] == "truncated"
    trace.write_bytes(b"".join(lines[:2] + lines[3:]))
    refused = run("evidence", "checkpoint", str(trace))
    assert refused.returncode == 1 and "seq_gap" in err(refused) and refused.stdout == b""


def test_verify_chain_bad_checkpoint_or_missing_trace_is_exit_2(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    write_trace(trace)
    checkpoint = tmp_path / "cp.json"
    checkpoint.write_text(json.dumps({"schema": "drawbridge.trace_checkpoint.v0", "seq": 1}))
    result = run("evidence", "verify-chain", str(trace), "--expected-head", str(checkpoint))
    assert result.returncode == 2 and "lacks field" in err(result)
    checkpoint.write_text("{not json")
    assert run("evidence", "verify-chain", str(trace), "--expected-head", str(checkpoint)).returncode == 2
    missing = run("evidence", "verify-chain", str(tmp_path / "absent.ndjson"))
    assert missing.returncode == 2 and "absent.ndjson" in err(missing)
    assert run("evidence", "verify-chain", str(tmp_path)).returncode == 2


def test_verify_chain_from_stdin(tmp_path: Path) -> None:
    lines = write_trace(tmp_path / "t.ndjson", 3)
    assert run("evidence", "verify-chain", "-", stdin=b"".join(lines)).returncode == 0
    assert run("evidence", "verify-chain", "-", stdin=b"".join(lines)[:-5]).returncode == 1


# --------------------------------------------------------------------------- verify-side-effects

KEY_TITLE_HASH = sha(b"assay.tool_target.v0:github_key_title:ci key")


def decision(repo: str, side_effect: dict[str, Any], verified: bool = False, tool: str = "github.add_deploy_key") -> dict:
    return {
        "server": {"id": "gh", "transport": "mcp"},
        "tool": {"name": tool, "category": "github_deploy_key"},
        "classification": "classified",
        "reason_code": "classified_github_deploy_key",
        "action": {
            "class": "privileged_admin_action",
            "verb": "create",
            "resource_type": "github_deploy_key",
            "target": {"provider": "github", "owner": "org", "repo": repo, "key_title_hash": KEY_TITLE_HASH},
            "required_scope": "repo:deploy_key:write",
        },
        "decision": {"effect": "allow", "source": "drawbridge", "rule_id": None, "enforced": True},
        "response": {
            "status": "success",
            "side_effect_asserted": True,
            "side_effect_verified": verified,
            "side_effect": side_effect,
        },
        "redaction": {"arguments_redacted": True, "credential_alias": None, "secret_material_stored": False},
        "correlation": {"basis": "none", "traceparent": None, "source_class": None},
    }


ASSERTED = {"asserted": True, "level": "asserted", "irreversibility_class": "one_way_consequential"}


def subject(repo: str) -> dict[str, Any]:
    return {
        "action_class": "github_deploy_key",
        "verb": "create",
        "target": {"owner": "org", "repo": repo, "key_title_hash": KEY_TITLE_HASH},
    }


def audit_record(repo: str, record_id: str, digest: str | None = None) -> dict[str, Any]:
    subj = subject(repo)
    return {
        "schema": "assay.provider_audit_record.v0",
        "provider": "github",
        "record_id": record_id,
        "subject": subj,
        "binding_digest": digest if digest is not None else sha(jcs(subj)),
        "non_claims": [],
    }


def surface(*decisions: dict[str, Any]) -> dict[str, Any]:
    return {"schema": "assay.tool_decision_surface.v0", "observed_tool_decisions": list(decisions), "non_claims": []}


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value, indent=2))
    return path


def test_side_effects_promoted_by_matching_record_from_directory(tmp_path: Path) -> None:
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    audit = tmp_path / "audit"
    audit.mkdir()
    write_json(audit / "b-other-artifact.json", {"schema": "something.else.v0"})
    write_json(audit / "a-match.json", audit_record("prod-repo", "rec-1"))
    (audit / "notes.txt").write_text("not read")
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit), "--format", "json")
    assert result.returncode == 0, err(result)
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["promoted"] == 1
    call = report["calls"][0]
    assert (call["level_before"], call["level"]) == ("asserted", "verified")
    assert call["subject_digest"] == sha(jcs(subject("prod-repo")))
    assert [r["status"] for r in report["audit_records"]] == ["matched"]
    skipped = {Path(s["source"]).name: s["reason"] for s in report["audit_imports_skipped"]}
    assert skipped == {"b-other-artifact.json": "schema is not assay.provider_audit_record.v0",
                       "notes.txt": "not a *.json file: not read"}

    table = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit))
    assert table.returncode == 0
    text = out(table)
    assert "asserted" in text and "verified" in text and "VERIFIED" in text
    assert "rec-1" in text and "b-other-artifact.json" in text
    assert "notes.txt" in text and "not a *.json file" in text  # listed, not read


def test_side_effects_a_matched_record_lists_no_other_calls_non_match_as_its_reason(tmp_path: Path) -> None:
    """The record for call 1 is tried against call 0 first (another repository): that attempt is kept in
    the JSON's ``rejections``, but the table gives a matched record no reason, and an unmatched one its
    attempt per call."""
    surf = write_json(tmp_path / "surface.json",
                      surface(decision("other-repo", ASSERTED), decision("prod-repo", ASSERTED)))
    audit = tmp_path / "audit"
    audit.mkdir()
    write_json(audit / "a-match.json", audit_record("prod-repo", "rec-1"))
    write_json(audit / "b-none.json", audit_record("third-repo", "rec-2"))
    report = json.loads(run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit),
                            "--format", "json").stdout)
    matched, unmatched = report["audit_records"]
    assert (matched["status"], matched["matched_call"], [r["call"] for r in matched["rejections"]]) == ("matched", 1, [0])
    assert (unmatched["status"], [r["call"] for r in unmatched["rejections"]]) == ("unmatched", [0])
    text = out(run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit), "--format", "table"))
    rows = text.split("Audit records", 1)[1]
    matched_row = next(line for line in rows.splitlines() if "rec-1" in line)
    assert "call 0" not in matched_row and "matched" in matched_row, text
    assert "call 0:" in rows.split("rec-2", 1)[1], text  # the unmatched record: its attempt, per call


def test_side_effects_an_audit_file_that_is_not_json_fails_naming_it(tmp_path: Path) -> None:
    """As verify-export fails it in a package: a .json import that is not JSON is never a quiet skip
    (it could be the record that vouches for a call)."""
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    audit = tmp_path / "audit"
    audit.mkdir()
    write_json(audit / "a-match.json", audit_record("prod-repo", "rec-1"))
    (audit / "c-broken.json").write_text("{nope")
    for output in ("json", "table"):
        result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit), "--format", output)
        lines = err(result).strip().splitlines()
        assert result.returncode == 2 and result.stdout == b"" and len(lines) == 1, err(result)
        assert str(audit / "c-broken.json") in lines[0] and "is not JSON" in lines[0] and "Traceback" not in lines[0]


def test_side_effects_one_record_imported_twice_vouches_for_one_call(tmp_path: Path) -> None:
    """Two identical calls and one provider record: the same path given twice is one import, and a copy
    of the record under another name (same record_id, same content) is listed and counted once."""
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED), decision("prod-repo", ASSERTED)))
    audit = tmp_path / "audit"
    audit.mkdir()
    record = write_json(audit / "gh1.json", audit_record("prod-repo", "gh-1"))
    (audit / "gh1-copy.json").write_bytes(record.read_bytes())
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(record), str(record),
                 "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["promoted"] == 1 and report["audit_records_imported"] == 1, report
    assert [c["level"] for c in report["calls"]] == ["verified", "asserted"]
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit), str(record),
                 "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["promoted"] == 1 and report["audit_records_imported"] == 1, report
    assert [(Path(r["source"]).name, r["status"], r.get("duplicate_of")) for r in report["audit_records"]] == [
        ("gh1-copy.json", "matched", None), ("gh1.json", "duplicate", str(audit / "gh1-copy.json"))]
    table = out(run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit)))
    assert "duplicate" in table and "counted once" in table


def test_side_effects_two_records_under_one_record_id_are_refused(tmp_path: Path) -> None:
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED), decision("other", ASSERTED)))
    audit = tmp_path / "audit"
    audit.mkdir()
    write_json(audit / "a.json", audit_record("prod-repo", "gh-1"))
    write_json(audit / "b.json", audit_record("other", "gh-1"))
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit))
    lines = err(result).strip().splitlines()
    assert result.returncode == 2 and result.stdout == b"" and len(lines) == 1, err(result)
    assert str(audit / "a.json") in lines[0] and str(audit / "b.json") in lines[0]
    assert "record_id 'gh-1' of provider 'github' with different content" in lines[0]


def _deep(levels: int) -> bytes:
    return b'{"schema": "assay.provider_audit_record.v0", "x": ' + b"[" * levels + b"]" * levels + b"}"


UNREADABLE_IMPORTS = {
    "dup-key": (b'{"schema": "assay.provider_audit_record.v0", "record_id": "r", "subject": {"x": 1}, '
                b'"subject": {"x": 2}, "binding_digest": "sha256:00"}',
                'is not strict JSON: the key "subject" appears twice in one object'),
    "bom": (b"\xef\xbb\xbf" + json.dumps(audit_record("prod-repo", "gh-1")).encode(), "starts with a byte order mark"),
    "utf16": (json.dumps(audit_record("prod-repo", "gh-1")).encode("utf-16"), "is not UTF-8"),
    "deep": (_deep(5000), "is not strict JSON: nesting is deeper than 64 levels, the depth limit"),
    "deep65": (_deep(64), "is not strict JSON: nesting is deeper than 64 levels, the depth limit"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE_IMPORTS))
def test_side_effects_an_audit_file_assay_would_not_read_is_refused(tmp_path: Path, name: str) -> None:
    """Assay's reader takes an audit import as strict JSON and skips any other file as no JSON: a record
    in UTF-16 or behind a byte order mark, or read here by the last of two equal keys, would give one
    import two verdicts. It is refused, as a file that is not JSON is, naming the rule it breaks."""
    data, reason = UNREADABLE_IMPORTS[name]
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    record = tmp_path / f"{name}.json"
    record.write_bytes(data)
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(record))
    lines = err(result).strip().splitlines()
    assert result.returncode == 2 and result.stdout == b"" and len(lines) == 1, err(result)
    assert lines[0].startswith(f"Error: {record} {reason}") and "Traceback" not in lines[0], lines[0]


def test_side_effects_lists_what_an_import_directory_holds_and_does_not_read(tmp_path: Path) -> None:
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    audit = tmp_path / "audit"
    audit.mkdir()
    write_json(audit / "rec.JSON", audit_record("prod-repo", "gh-1"))
    (audit / "recs.ndjson").write_text("{}\n")
    (audit / "sub.json").mkdir()
    (audit / "a\x1b[31mRED.txt").write_text("x")
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(audit), "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["audit_records_imported"] == 0 and report["promoted"] == 0
    assert [(Path(s["source"]).name, s["reason"]) for s in report["audit_imports_skipped"]] == [
        ("a\ufffd[31mRED.txt", "not a *.json file: not read"), ("rec.JSON", "not a *.json file: not read"),
        ("recs.ndjson", "not a *.json file: not read"), ("sub.json", "not a regular file: not read")]


def test_side_effects_inconsistent_record_is_exit_1_with_reason(tmp_path: Path) -> None:
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    record = write_json(tmp_path / "forged.json", audit_record("prod-repo", "rec-forged", digest="sha256:" + "0" * 64))
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(record))
    assert result.returncode == 1
    text = out(result)
    assert "rec-forged" in text and "rejected" in text and "record_inconsistent" in text and "FAILED" in text
    report = json.loads(
        run("evidence", "verify-side-effects", str(surf), "--audit-import", str(record), "--format", "json").stdout
    )
    assert report["ok"] is False and report["audit_records_rejected"] == 1
    assert report["calls"][0]["level"] == "asserted"


def test_side_effects_overclaimed_level_is_exit_1(tmp_path: Path) -> None:
    claimed = {
        "asserted": True,
        "level": "verified",
        "verification_source": "provider_audit_import",
        "verification_subject_digest": sha(jcs(subject("other-repo"))),
        "irreversibility_class": "one_way_consequential",
    }
    surf = write_json(
        tmp_path / "surface.json",
        surface(decision("prod-repo", ASSERTED), decision("other-repo", claimed, verified=True)),
    )
    # The only record binds the first call; the second call's "verified" is not reproduced.
    first = write_json(tmp_path / "one.json", audit_record("prod-repo", "rec-1"))
    unrelated = write_json(tmp_path / "two.json", audit_record("third-repo", "rec-3"))
    result = run(
        "evidence", "verify-side-effects", str(surf), "--audit-import", str(first), str(unrelated), "--format", "json"
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["levels_not_reproduced"] == 1
    assert [(c["level_before"], c["level"]) for c in report["calls"]] == [("asserted", "verified"), ("verified", "asserted")]
    statuses = {r["record_id"]: r["status"] for r in report["audit_records"]}
    assert statuses == {"rec-1": "matched", "rec-3": "unmatched"}
    table = out(run("evidence", "verify-side-effects", str(surf), "--audit-import", str(first), str(unrelated)))
    assert "recorded verified" in table and "binds_different_call" in table


def test_side_effects_a_recorded_digest_that_is_not_the_calls_fails(tmp_path: Path) -> None:
    """A record edited to verified, its digest zeroes: a real record binds the call, so the level is
    reproduced, but the recorded verification_subject_digest is not the one re-derived."""
    zero = "sha256:" + "0" * 64
    edited = {**ASSERTED, "level": "verified", "verification_source": "provider_audit_import",
              "verification_subject_digest": zero}
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", edited, verified=True)))
    record = write_json(tmp_path / "gh1.json", audit_record("prod-repo", "gh-1"))
    result = run("evidence", "verify-side-effects", str(surf), "--audit-import", str(record), "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["ok"] is False and report["levels_not_reproduced"] == 1, report
    assert report["calls"][0]["level"] == "verified" and report["calls"][0]["recorded_subject_digest"] == zero
    table = out(run("evidence", "verify-side-effects", str(surf), "--audit-import", str(record)))
    assert "FAILED" in table and "is not the call's" in table, table


def test_side_effects_input_errors_are_exit_2(tmp_path: Path) -> None:
    good = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    wrong_schema = write_json(tmp_path / "wrong.json", {"schema": "nope", "observed_tool_decisions": []})
    no_flag = run("evidence", "verify-side-effects", str(good), str(bad_json))
    assert no_flag.returncode == 2 and "--audit-import" in err(no_flag)
    assert run("evidence", "verify-side-effects", str(bad_json)).returncode == 2
    wrong = run("evidence", "verify-side-effects", str(wrong_schema))
    assert wrong.returncode == 2 and "schema" in err(wrong)
    missing = run("evidence", "verify-side-effects", str(good), "--audit-import", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "absent" in err(missing)


def test_side_effects_without_imports_rederive_asserted(tmp_path: Path) -> None:
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED)))
    result = run("evidence", "verify-side-effects", str(surf), "--format", "json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["calls"][0]["level"] == "asserted"


def test_table_output_does_not_interpret_markup_or_controls(tmp_path: Path) -> None:
    hostile = "[bold red]evil[/] \x1b[2J"
    surf = write_json(tmp_path / "surface.json", surface(decision("prod-repo", ASSERTED, tool=hostile)))
    result = run("evidence", "verify-side-effects", str(surf))
    assert result.returncode == 0
    text = out(result)
    assert "[bold red]evil[/]" in text
    assert "\x1b" not in text


# --------------------------------------------------------------------------- verify-tdt

# The "base" policy and the "match" / "mismatch_denied_tool" cases of the format's conformance vectors.
BASE_POLICY = {
    "version": "1",
    "tools": {"allow": ["read_file", "deploy"], "deny": ["delete_all"]},
    "schemas": {
        "deploy": {"type": "object", "required": ["env"], "properties": {"env": {"enum": ["staging", "prod"]}}}
    },
    "enforcement": {"unconstrained_tools": "warn"},
}


def case(case_id: str, tool: str, args: dict[str, Any], verdict: str) -> dict[str, Any]:
    return {
        "id": case_id,
        "policy": "base",
        "observed": [{"tool_name": tool, "args": args, "order": 0, "identity_state": "present", "evidence": None}],
        "expected": {"decisions": [verdict], "run_verdict": verdict},
    }


def carrier_and_row(order: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    from drawbridge.evidence.truth.carrier import build_carrier
    from drawbridge.evidence.truth.declared import declared_policy_digest
    from drawbridge.evidence.truth.pack import pack_recipe_row

    carrier = build_carrier(
        tool_name="deploy",
        args={"env": "staging"},
        order=order,
        declared_policy_digest=declared_policy_digest(BASE_POLICY),
        key=b"k" * 32,
        key_id="test-key",
        source_class="authoritative_boundary",
        call_id=f"call-{order}",
        result_status="ok",
        identity_state="present",
        decision_verdict="match",
    )
    return carrier, pack_recipe_row(carrier, "match", f"assay://evidence-event/run/{order}")


def vectors_document() -> dict[str, Any]:
    carrier, row = carrier_and_row()
    return {
        "schema": "assay.tool_decision_truth.vectors.v0",
        "policies": {"base": BASE_POLICY},
        "cases": [
            case("match", "deploy", {"env": "staging"}, "match"),
            case("mismatch_denied_tool", "delete_all", {}, "mismatch"),
        ],
        "run_verdict_units": [],
        "carriers": [{"id": "c0", "policy": "base", "carrier": carrier}],
        "pack_rows": [{"id": "r0", "carrier_id": "c0", "run_verdict": "match", "row": row}],
        "negative_pack_rows": [
            {"id": "tampered_verdict", "carrier_id": "c0", "run_verdict": "match", "row": {**row, "run_verdict": "mismatch"}}
        ],
    }


def write_ndjson(path: Path, values: list[Any]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path


def test_verify_tdt_vectors_document_ok(tmp_path: Path) -> None:
    doc = write_json(tmp_path / "vectors.json", vectors_document())
    result = run("evidence", "verify-tdt", str(doc), "--format", "json")
    assert result.returncode == 0, out(result)
    report = json.loads(result.stdout)
    assert report["ok"] is True
    ids = {c["id"] for c in report["checks"]}
    assert {"case:match", "case:mismatch_denied_tool", "carrier:c0", "pack_row:r0"} <= ids
    table = run("evidence", "verify-tdt", str(doc))
    assert table.returncode == 0
    assert "vectors document" in out(table) and "case:match" in out(table) and "VERIFIED" in out(table)


def test_verify_tdt_vectors_document_wrong_expectation_is_exit_1(tmp_path: Path) -> None:
    document = vectors_document()
    document["cases"][0]["expected"] = {"decisions": ["mismatch"], "run_verdict": "mismatch"}
    doc = write_json(tmp_path / "vectors.json", document)
    result = run("evidence", "verify-tdt", str(doc))
    assert result.returncode == 1
    text = out(result)
    assert "case:match" in text and "FAIL" in text and "FAILED" in text
    report = json.loads(run("evidence", "verify-tdt", str(doc), "--format", "json").stdout)
    failed = [c["id"] for c in report["checks"] if not c["ok"]]
    assert failed == ["case:match"]


def test_verify_tdt_carriers_with_rows(tmp_path: Path) -> None:
    pairs = [carrier_and_row(i) for i in range(3)]
    carriers = write_ndjson(tmp_path / "carriers.ndjson", [c for c, _ in pairs])
    rows = write_ndjson(tmp_path / "rows.ndjson", [r for _, r in pairs])
    alone = run("evidence", "verify-tdt", str(carriers), "--format", "json")
    assert alone.returncode == 0
    assert json.loads(alone.stdout)["carrier_count"] == 3
    with_rows = run("evidence", "verify-tdt", str(carriers), "--rows", str(rows), "--format", "json")
    assert with_rows.returncode == 0
    report = json.loads(with_rows.stdout)
    assert (report["row_count"], report["verified_rows"]) == (3, 3)
    table = run("evidence", "verify-tdt", str(carriers), "--rows", str(rows))
    assert table.returncode == 0 and "carriers" in out(table) and "policy_correctness" in out(table)


def test_verify_tdt_tampered_row_or_carrier_is_exit_1(tmp_path: Path) -> None:
    carrier, row = carrier_and_row()
    carriers = write_ndjson(tmp_path / "carriers.ndjson", [carrier])
    tampered = write_ndjson(tmp_path / "rows.ndjson", [{**row, "run_verdict": "mismatch"}])
    result = run("evidence", "verify-tdt", str(carriers), "--rows", str(tampered), "--format", "json")
    assert result.returncode == 1
    assert [c["id"] for c in json.loads(result.stdout)["checks"] if not c["ok"]] == ["row_0"]
    leaky = write_ndjson(tmp_path / "leaky.ndjson", [{**carrier, "arguments": {"env": "staging"}}])
    result = run("evidence", "verify-tdt", str(leaky))
    assert result.returncode == 1 and "carrier_0" in out(result)


def test_verify_tdt_policy_digest_option(tmp_path: Path) -> None:
    carrier, _ = carrier_and_row()
    carriers = write_ndjson(tmp_path / "carriers.ndjson", [carrier])
    right = carrier["declared_policy_digest"]
    assert run("evidence", "verify-tdt", str(carriers), "--declared-policy-digest", right).returncode == 0
    other = "sha256:" + "ab" * 32
    assert run("evidence", "verify-tdt", str(carriers), "--declared-policy-digest", other).returncode == 1
    assert run("evidence", "verify-tdt", str(carriers), "--declared-policy-digest", "sha256:xyz").returncode == 2


@pytest.mark.parametrize("lines", [1, 2])
@pytest.mark.parametrize("where", ["carriers", "rows"])
def test_verify_tdt_refuses_a_line_that_gives_a_key_twice(tmp_path: Path, lines: int, where: str) -> None:
    """A carrier that says ``"decision_verdict":"mismatch","decision_verdict":"match"`` verifies under the
    last reading and means the first to a reader that keeps it: refused as unreadable input."""
    pairs = [carrier_and_row(i) for i in range(lines)]
    carriers = write_ndjson(tmp_path / "carriers.ndjson", [c for c, _ in pairs])
    rows = write_ndjson(tmp_path / "rows.ndjson", [r for _, r in pairs])
    target = carriers if where == "carriers" else rows
    text = target.read_text().splitlines()
    field = '"decision_verdict": "match"' if where == "carriers" else '"run_verdict": "match"'
    assert field in text[-1]
    text[-1] = text[-1].replace(field, field.replace('"match"', '"mismatch"') + ", " + field)
    target.write_text("\n".join(text) + "\n")
    result = run("evidence", "verify-tdt", str(carriers), "--rows", str(rows))
    assert result.returncode == 2, out(result)
    assert "is given twice in one object" in err(result) and str(target) in err(result)


def test_verify_tdt_input_errors_are_exit_2(tmp_path: Path) -> None:
    carrier, _ = carrier_and_row()
    broken = tmp_path / "broken.ndjson"
    broken.write_text(json.dumps(carrier) + "\n{oops\n")
    result = run("evidence", "verify-tdt", str(broken))
    assert result.returncode == 2 and "line 2" in err(result)
    doc = write_json(tmp_path / "vectors.json", vectors_document())
    rows = write_ndjson(tmp_path / "rows.ndjson", [])
    assert run("evidence", "verify-tdt", str(doc), "--rows", str(rows)).returncode == 2
    assert run("evidence", "verify-tdt", str(tmp_path / "absent.ndjson")).returncode == 2


def test_subcommands_are_discovered_from_cmd_modules() -> None:
    from drawbridge.cli.main import discovered_commands

    found = discovered_commands()
    assert found["evidence"] == "drawbridge.cli.evidence_cmd"
    assert all(module.endswith("_cmd") for module in found.values())
    assert all("_" not in name for name in found)


def test_an_out_file_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path) -> None:
    trace = tmp_path / "trace.ndjson"
    write_trace(trace)
    (tmp_path / "afile").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    cases = [(tmp_path, "is a directory"), (tmp_path / "none" / "x", "No such file or directory"),
             (tmp_path / "afile" / "x", "Not a directory")]
    if os.geteuid() != 0:
        cases.append((locked / "x", "Permission denied"))
    for target, why in cases:
        refused = run("evidence", "checkpoint", str(trace), "--out", str(target))
        assert refused.returncode == 2, err(refused)
        assert "Traceback" not in err(refused) and len(err(refused).strip().splitlines()) == 1, err(refused)
        assert f"{target}: " in err(refused) and why in err(refused)


def test_evidence_keys_with_both_directories_says_not_both(tmp_path: Path) -> None:
    both = run("evidence", "keys", "--evidence-dir", str(tmp_path), "--keys-dir", str(tmp_path))
    assert both.returncode == 2 and "give one of --evidence-dir or --keys-dir, not both" in err(both)
    neither = run("evidence", "keys")
    assert neither.returncode == 2 and "not both" not in err(neither)
