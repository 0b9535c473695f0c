"""The auditor package: Assay's bundle format byte for byte (its committed bundles and pins, and ours,
recomputed here from bytes with hashlib and rfc8785), an export of a real gateway run after an approval,
a denial, a carrier mismatch and an audit import that verifies, and any one-byte change in any package
file that fails ``verify-export``."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from conftest import PYTHON, child_env, scaled
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_der_public_key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drawbridge.evidence.bundle import BundleError, Producer, make_event, verify_bundle, write_bundle
from drawbridge.evidence.bundle_archive import gunzip, read_members
from drawbridge.evidence.dsse import keyid, open_envelope, sign_statement, verify_bundle_attestation
from drawbridge.evidence.export_verify import verify_export
from drawbridge.evidence.signed_note import parse_vkey
from drawbridge.state.signing_keys import read_public_pem

VECTORS = Path(__file__).resolve().parent / "vectors" / "bundle"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "drawbridge", *args], capture_output=True, text=True, timeout=scaled(180),
                          env=child_env())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- Assay's own bytes


@pytest.mark.parametrize("name", ["assay-test-bundle.tar.gz", "assay-demo-bundle.tar.gz"])
def test_assays_committed_bundles_are_rebuilt_to_the_same_tar_bytes(name: str) -> None:
    """Two bundles written by Assay's Rust BundleWriter (committed in its repository, MIT): our writer,
    given their events, writes the same manifest, events and uncompressed tar stream."""
    archive = (VECTORS / name).read_bytes()
    assert archive[:10] == bytes.fromhex("1f8b08000000000002ff")  # no name, mtime 0, XFL 2, OS 255
    tar = gzip.decompress(archive)
    verified = verify_bundle(archive)
    rebuilt = write_bundle(verified.events, Producer(**verified.manifest["producer"]))
    assert rebuilt.tar == tar
    assert rebuilt.archive[:10] == archive[:10] and gzip.decompress(rebuilt.archive) == tar


def test_assays_golden_pins_are_reproduced() -> None:
    """assay-evidence's determinism test pins the manifest and events of one fixed event."""
    data = {"seq": 0, "message": "This is a deterministic test event",
            "nested": {"z_field": 3, "a_field": 1, "m_field": 2}}
    event = make_event(run_id="run_golden_test_12345", seq=0, source="urn:assay:determinism-test",
                       producer=Producer("assay-evidence-test", "0.1.0-test", "abc1234"),
                       event_type="assay.determinism.test", data=data, time="2023-11-14T22:13:20Z")
    written = write_bundle([event])
    assert sha(written.manifest) == "1412325ee64c94de98d21ed26750d23c26f71c47c4d156d70dfd6110da7541fa"
    assert sha(written.events) == "2c338577727ae79d1e4e0c64fb7f924951da3264ac3667caa0476e56c51e5917"


def test_assays_dsse_key_id_and_pae() -> None:
    """Assay's supply-chain DSSE fixture (seed 0x07 x 32): the same key id, and its envelope opens."""
    trusted = json.loads((VECTORS / "assay-pinned-ed25519.trustedkey.json").read_text())
    public = load_der_public_key(base64.b64decode(trusted["public_key"]))
    assert keyid(Ed25519PrivateKey.from_private_bytes(b"\x07" * 32).public_key()) == trusted["key_id"]
    assert keyid(public) == trusted["key_id"]  # type: ignore[arg-type]
    statement = open_envelope((VECTORS / "assay-slsa-provenance.dsse.json").read_bytes(), public)  # type: ignore[arg-type]
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"


# --------------------------------------------------------------------------- our committed vector


def _content_hash(event: dict[str, Any]) -> str:
    hashed = {key: event[key] for key in ("specversion", "type", "datacontenttype", "subject", "data") if key in event}
    return "sha256:" + sha(rfc8785.dumps(hashed))


def test_our_committed_bundle_recomputes_from_its_bytes() -> None:
    """A bundle drawbridge wrote for a real run, committed: every digest recomputed here by hand, and the
    writer reproduces the committed member and tar bytes."""
    directory = VECTORS / "drawbridge-run"
    manifest_bytes = (directory / "manifest.json").read_bytes()
    events_bytes = (directory / "events.ndjson").read_bytes()
    expected = json.loads((directory / "expected.json").read_text())
    assert sha(manifest_bytes) == expected["manifest_sha256"] and sha(events_bytes) == expected["events_sha256"]
    events = [json.loads(line) for line in events_bytes.splitlines()]
    for seq, (line, event) in enumerate(zip(events_bytes.splitlines(), events, strict=True)):
        assert line == rfc8785.dumps(event)  # each line is the JCS of its event
        assert event["assaycontenthash"] == _content_hash(event)
        assert (event["assayseq"], event["id"]) == (seq, f"{event['assayrunid']}:{seq}")
        assert event["source"].startswith("urn:drawbridge:gateway:drawbridge.local/")
    root = "sha256:" + sha("".join(e["assaycontenthash"] + "\n" for e in events).encode())
    manifest = json.loads(manifest_bytes)
    assert manifest_bytes == rfc8785.dumps(manifest)
    assert manifest["run_root"] == manifest["bundle_id"] == root
    assert manifest["files"]["events.ndjson"] == {"path": "events.ndjson", "sha256": "sha256:" + sha(events_bytes),
                                                   "bytes": len(events_bytes)}
    assert [e["type"] for e in events][-1] == "drawbridge.tlog_checkpoint.v0"
    written = write_bundle(events, Producer(**manifest["producer"]))
    assert (written.manifest, written.events) == (manifest_bytes, events_bytes)
    assert sha(written.tar) == expected["tar_sha256"] and len(written.tar) == expected["tar_bytes"]
    verified = verify_bundle(written.archive)
    assert verified.manifest == manifest


def test_the_bundle_verifier_applies_assays_rules() -> None:
    events = [json.loads(line) for line in (VECTORS / "drawbridge-run" / "events.ndjson").read_bytes().splitlines()]
    good = write_bundle(events)
    tar = gzip.decompress(good.archive)
    members = read_members(tar)
    assert list(members) == ["manifest.json", "events.ndjson"]
    changed = [dict(e) for e in events]
    changed[2] = {**changed[2], "data": {**changed[2]["data"], "schema": "x"}}
    forged = members["events.ndjson"].replace(
        rfc8785.dumps(events[2]), rfc8785.dumps(changed[2]))
    from drawbridge.evidence.bundle_archive import gzip_wrap, tar_stream

    with pytest.raises(BundleError, match="size|sha256|content"):
        verify_bundle(gzip_wrap(tar_stream([("manifest.json", members["manifest.json"]), ("events.ndjson", forged)])))
    with pytest.raises(BundleError, match="first tar member"):
        verify_bundle(gzip_wrap(tar_stream([("events.ndjson", members["events.ndjson"]),
                                            ("manifest.json", members["manifest.json"])])))
    with pytest.raises(BundleError):
        verify_bundle(good.archive[:-3])  # the gzip trailer cut
    assert gunzip(good.archive) == tar


def _vector() -> tuple[list[dict[str, Any]], bytes, bytes]:
    directory = VECTORS / "drawbridge-run"
    events_bytes = (directory / "events.ndjson").read_bytes()
    return [json.loads(line) for line in events_bytes.splitlines()], (directory / "manifest.json").read_bytes(), events_bytes


def _archive(manifest: bytes, events_bytes: bytes) -> bytes:
    """A bundle of these member bytes, its manifest's events.ndjson entry made to fit them (so that only
    the rule under test can refuse it)."""
    from drawbridge.evidence.bundle_archive import gzip_wrap, tar_stream

    entry = json.dumps({"bytes": len(events_bytes), "path": "events.ndjson", "sha256": "sha256:" + sha(events_bytes)},
                       separators=(",", ":")).encode()
    fitted = manifest if b'{"bytes":' not in manifest else \
        manifest.replace(manifest[manifest.index(b'{"bytes":'):manifest.index(b"}}") + 1], entry)
    return gzip_wrap(tar_stream([("manifest.json", fitted), ("events.ndjson", events_bytes)]))


def test_the_content_hash_is_over_the_events_own_datacontenttype() -> None:
    """Assay's compute_content_hash hashes the event's datacontenttype as it stands: an event of another
    type, hashed over it, verifies; one whose type was changed but not its hash does not."""
    events, manifest, events_bytes = _vector()
    assert verify_bundle(_archive(manifest, events_bytes)).manifest == json.loads(manifest)  # the helper alone
    typed = {**events[0], "datacontenttype": "text/plain; charset=utf-8"}
    hashed = {key: typed[key] for key in ("specversion", "type", "datacontenttype", "data")}
    typed["assaycontenthash"] = "sha256:" + sha(rfc8785.dumps(hashed))
    verified = verify_bundle(write_bundle([typed, *events[1:]]).archive)
    assert verified.events[0]["assaycontenthash"] == typed["assaycontenthash"] != events[0]["assaycontenthash"]
    retyped = events_bytes.replace(b'"datacontenttype":"application/json"', b'"datacontenttype":"text/plain"', 1)
    with pytest.raises(BundleError, match="line 1: assaycontenthash does not match"):
        verify_bundle(_archive(manifest, retyped))


def _duplicate_in_data(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest, events_bytes.replace(b'"data":{', b'"data":{"schema":"x",', 1)  # the record has "schema" too


def _duplicate_in_event(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest, events_bytes.replace(b'{"assaycontenthash"', b'{"assaypii":true,"assaycontenthash"', 1)


def _duplicate_in_manifest(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest.replace(b'"run_id":', b'"run_id":"elsewhere","run_id":'), events_bytes


def _utf16_manifest(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest.decode().encode("utf-16"), events_bytes


def _utf32_manifest(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest.decode().encode("utf-32"), events_bytes


def _surrogate_in_manifest(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest.replace(b'"name":"drawbridge"', b'"name":"drawbridge\\ud800"'), events_bytes


def _surrogate_in_event(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest, events_bytes.replace(b'"data":{', b'"data":{"note":"\\udc00",', 1)


def _deep_in_event(manifest: bytes, events_bytes: bytes) -> tuple[bytes, bytes]:
    return manifest, events_bytes.replace(b'"data":{', b'"data":{"deep":' + b"[" * 5000 + b"]" * 5000 + b",", 1)


@pytest.mark.parametrize(("edit", "reason"), [
    (_deep_in_event, "line 1 is not strict JSON: nesting is deeper than 64 levels, the depth limit"),
    (_duplicate_in_data, 'line 1 is not strict JSON: the key "schema" appears twice'),
    (_duplicate_in_event, 'line 1 is not strict JSON: the key "assaypii" appears twice'),
    (_duplicate_in_manifest, 'manifest.json is not strict JSON: the key "run_id" appears twice'),
    (_utf16_manifest, "manifest.json is not UTF-8"),
    (_utf32_manifest, "manifest.json is not UTF-8"),
    (_surrogate_in_manifest, "manifest.json is not strict JSON: a string holds a lone surrogate"),
    (_surrogate_in_event, "line 1 is not strict JSON: a string holds a lone surrogate"),
])
def test_the_bundle_is_read_as_assays_strict_json(edit: Any, reason: str) -> None:
    """auditor-evidence.md 1.6: the manifest and each event line are UTF-8 and strict JSON (no duplicate
    key anywhere, no lone surrogate). Each bundle here differs from the committed one by that alone."""
    _events, manifest, events_bytes = _vector()
    with pytest.raises(BundleError) as refused:
        verify_bundle(_archive(*edit(manifest, events_bytes)))
    assert reason in str(refused.value)


# --------------------------------------------------------------------------- a real run, exported


GITHUB_KEY_TITLE = "assay.tool_target.v0:github_key_title:ci"


def _audit_record() -> dict[str, Any]:
    """A provider audit record of the deploy key the demo's person approved (acme/rocket, title ci)."""
    subject = {"action_class": "github_deploy_key", "verb": "create",
               "target": {"owner": "acme", "repo": "rocket", "key_title_hash": "sha256:" + sha(GITHUB_KEY_TITLE.encode())}}
    return {"schema": "assay.provider_audit_record.v0", "provider": "github", "record_id": "audit-1",
            "subject": subject, "binding_digest": "sha256:" + sha(rfc8785.dumps(subject)),
            "non_claims": ["imported from a provider audit export"]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo (an allowed read, a denied write, a call a person approved in-band, a denied privileged
    call whose carrier is a mismatch), exported with an audit import."""
    base = tmp_path_factory.mktemp("export")
    done = cli("demo", "--dir", str(base / "demo"))
    assert done.returncode == 0, done.stdout + done.stderr
    evidence = next((base / "demo").glob("run-*/evidence"))
    audit = base / "audit"
    audit.mkdir()
    (audit / "github-audit-1.json").write_text(json.dumps(_audit_record()))
    done = cli("evidence", "export", "--evidence-dir", str(evidence), "--carriers", str(evidence / "carriers.ndjson"),
               "--audit-import", str(audit), "--out", str(base / "package"), "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    return evidence, base / "package"


def _files(package: Path) -> dict[str, bytes]:
    return {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


def _verify(files: dict[str, bytes], evidence: Path) -> dict[str, Any]:
    return verify_export(files, vkey=parse_vkey((evidence / "keys" / "checkpoint.vkey").read_text()),
                         attestation_key=read_public_pem(evidence / "keys" / "attestation.pub.pem"), keys_pinned=True)


def test_an_exported_run_verifies_with_pinned_keys(exported: tuple[Path, Path]) -> None:
    evidence, package = exported
    assert set(_files(package)) >= {"bundle.tar.gz", "bundle.tar.gz.intoto.json", "export.intoto.json",
                                    "trace/trace.ndjson", "trace/checkpoint", "trace/checkpoints.ndjson",
                                    "keys/checkpoint.vkey", "keys/attestation.pub.pem", "audit-import/github-audit-1.json"}
    assert not [name for name, data in _files(package).items() if b"PRIVATE KEY" in data]
    done = cli("evidence", "verify-export", str(package), "--vkey", str(evidence / "keys" / "checkpoint.vkey"),
               "--attestation-key", str(evidence / "keys" / "attestation.pub.pem"), "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert report["schema"] == "drawbridge.export_verify.report.v0" and report["keys"] == "pinned"
    ids = {check["id"] for check in report["checks"]}
    assert ids == {"export_attestation", "bundle_integrity", "bundle_attestation", "tool_decision_truth",
                   "side_effects", "trace_chain", "checkpoint", "run_sealed", "bundle_checkpoint", "trace_binding",
                   "observed_confirmed", "tlog_proofs"}
    side = next(check for check in report["checks"] if check["id"] == "side_effects")
    assert "1 verified through 1 audit record" in side["detail"]  # the approved deploy key, by the import
    assert set(report["claims_not_made"]) >= {"completeness_after_last_external_checkpoint", "key_not_compromised"}
    # The bundle: the run's records in trace order (a mismatch carrier among them), rows, the checkpoint.
    verified = verify_bundle((package / "bundle.tar.gz").read_bytes())
    types = [event["type"] for event in verified.events]
    assert types == ["assay.tool_decision_surface.v0", "assay.tool_decision_truth.v0"] * 4 \
        + ["assay.tool_decision_truth.recipe_row.v0"] * 4 + ["drawbridge.tlog_checkpoint.v0"]
    verdicts = [e["data"]["decision_verdict"] for e in verified.events if e["type"] == "assay.tool_decision_truth.v0"]
    assert "mismatch" in verdicts
    decisions = [e["data"]["observed_tool_decisions"][0] for e in verified.events
                 if e["type"] == "assay.tool_decision_surface.v0"]
    assert [d["decision"]["effect"] for d in decisions] == ["allow", "deny", "allow", "deny"]
    trace = [json.loads(line) for line in (package / "trace" / "trace.ndjson").read_text().splitlines()]
    assert any(entry["kind"] == "approval_resolved" for entry in trace)
    attested = verify_bundle_attestation((package / "bundle.tar.gz.intoto.json").read_bytes(),
                                         read_public_pem(evidence / "keys" / "attestation.pub.pem"),
                                         (package / "bundle.tar.gz").read_bytes())
    assert attested["subject"][0]["digest"]["sha256"] == sha((package / "bundle.tar.gz").read_bytes())


FILES_OF_A_PACKAGE = st.data()


def test_another_logs_vkey_fails_the_checkpoint_without_denying_the_run_end(
    tmp_path: Path, exported: tuple[Path, Path]
) -> None:
    """The run has its run_end: a checkpoint that does not verify under the key given leaves the run
    unsealed, and run_sealed says so, never that the run_end is missing (a crash or a cut)."""
    from drawbridge.state.signing_keys import open_keys

    evidence, package = exported
    open_keys(tmp_path / "other-keys")
    done = cli("evidence", "verify-export", str(package), "--vkey", str(tmp_path / "other-keys" / "checkpoint.vkey"),
               "--attestation-key", str(evidence / "keys" / "attestation.pub.pem"), "--format", "json")
    failed = _failed(json.loads(done.stdout))
    assert done.returncode == 1 and {"checkpoint", "run_sealed"} <= set(failed), failed
    assert "no run_end" not in failed["run_sealed"] and "crash" not in failed["run_sealed"], failed
    assert "run_end (line" in failed["run_sealed"] and "no checkpoint verified" in failed["run_sealed"], failed


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=FILES_OF_A_PACKAGE)
def test_any_one_byte_change_in_any_package_file_fails(exported: tuple[Path, Path], data: st.DataObject) -> None:
    evidence, package = exported
    files = _files(package)
    name = data.draw(st.sampled_from(sorted(files)))
    position = data.draw(st.integers(0, len(files[name]) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda b: b != files[name][position]))
    changed = bytearray(files[name])
    changed[position] = value
    report = _verify({**files, name: bytes(changed)}, evidence)
    assert report["ok"] is False, (name, position, value)


@pytest.mark.parametrize("name", ["bundle.tar.gz", "export.intoto.json", "trace/trace.ndjson", "trace/checkpoint",
                                  "trace/checkpoints.ndjson", "keys/checkpoint.vkey", "audit-import/github-audit-1.json"])
def test_every_file_counts_its_first_and_last_byte(exported: tuple[Path, Path], name: str) -> None:
    evidence, package = exported
    files = _files(package)
    for position in (0, len(files[name]) - 1):
        changed = bytearray(files[name])
        changed[position] ^= 0x01
        assert _verify({**files, name: bytes(changed)}, evidence)["ok"] is False, (name, position)
    missing = dict(files)
    del missing[name]
    assert _verify(missing, evidence)["ok"] is False
    assert _verify({**files, "extra.txt": b"x"}, evidence)["ok"] is False


def test_a_record_left_out_and_everything_re_signed_fails_the_trace_binding(exported: tuple[Path, Path]) -> None:
    """The operator holds the attestation key: drop a denied call's records from the bundle, sign the
    bundle and the package again. The trace still names them: the binding fails."""
    evidence, package = exported
    files = _files(package)
    kept = [e for e in _events(files) if not (e["type"] == "assay.tool_decision_surface.v0"
                                               and e["data"]["observed_tool_decisions"][0]["decision"]["effect"] == "deny")]
    report = _verify(_re_signed(files, kept, evidence), evidence)
    failed = {check["id"] for check in report["checks"] if not check["ok"]}
    assert "trace_binding" in failed and "export_attestation" not in failed and "bundle_integrity" not in failed


def _re_signed(files: dict[str, bytes], events: list[dict[str, Any]], evidence: Path,
               audit: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """What the operator, who holds the attestation key, can do: a bundle of other events (renumbered, each
    content hash recomputed), other audit imports, and both DSSE envelopes signed again."""
    from drawbridge.evidence.bundle import content_hash
    from drawbridge.evidence.dsse import bundle_statement
    from drawbridge.state.signing_keys import load_keys

    verified = verify_bundle(files["bundle.tar.gz"])
    renumbered = [{**event, "assayseq": seq, "id": f"{event['assayrunid']}:{seq}",
                   "assaycontenthash": content_hash(event["type"], event["data"])} for seq, event in enumerate(events)]
    keys = load_keys(evidence / "keys")
    bundle = write_bundle(renumbered, Producer(**verified.manifest["producer"]))
    forged = {name: data for name, data in files.items() if not (audit is not None and name.startswith("audit-import/"))}
    forged.update({f"audit-import/{name}": data for name, data in (audit or {}).items()})
    forged.update({"bundle.tar.gz": bundle.archive,
                   "bundle.tar.gz.intoto.json": sign_statement(bundle_statement(bundle.archive), keys.attestation)})
    return _re_attested(forged, evidence, files, {"bundle_id": bundle.run_root})


def _re_attested(forged: dict[str, bytes], evidence: Path, original: dict[str, bytes],
                 changed: dict[str, Any] | None = None) -> dict[str, bytes]:
    """``forged`` with its export statement signed again by the operator's attestation key, the original
    predicate with ``changed`` over it."""
    from drawbridge.evidence.dsse import export_statement
    from drawbridge.state.signing_keys import load_keys

    rest = {name: data for name, data in forged.items() if name != "export.intoto.json"}
    statement = json.loads(base64.b64decode(json.loads(original["export.intoto.json"])["payload"]))
    predicate = {**statement["predicate"], **(changed or {})}
    return {**rest, "export.intoto.json": sign_statement(export_statement(rest, predicate),
                                                          load_keys(evidence / "keys").attestation)}


def _failed(report: dict[str, Any]) -> dict[str, str]:
    return {check["id"]: check["detail"] for check in report["checks"] if not check["ok"]}


def _events(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [dict(event) for event in verify_bundle(files["bundle.tar.gz"]).events]


def _cli_verify(package: Path, evidence: Path) -> tuple[int, dict[str, Any]]:
    done = cli("evidence", "verify-export", str(package), "--vkey", str(evidence / "keys" / "checkpoint.vkey"),
               "--attestation-key", str(evidence / "keys" / "attestation.pub.pem"),
               "--known-checkpoint", str(evidence / "checkpoint"), "--format", "json")
    return done.returncode, json.loads(done.stdout)


def _written(tmp_path: Path, files: dict[str, bytes]) -> Path:
    package = tmp_path / "forged"
    for name, data in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes(data)
    return package


def _edit_time(events: list[dict[str, Any]]) -> str:
    events[0]["time"] = "2020-01-01T00:00:00Z"
    return "trace_binding"


def _edit_source(events: list[dict[str, Any]]) -> str:
    for event in events:
        event["source"] = "urn:drawbridge:gateway:elsewhere.example/gw"
    return "trace_binding"


def _zero_root(events: list[dict[str, Any]]) -> str:
    events[-1]["data"] = {**events[-1]["data"], "root_hash": base64.b64encode(bytes(32)).decode()}
    return "bundle_checkpoint"


def _bogus_schema(events: list[dict[str, Any]]) -> str:
    events[-1]["data"] = {**events[-1]["data"], "schema": "bogus"}
    return "bundle_checkpoint"


def _extra_field(events: list[dict[str, Any]]) -> str:
    events[-1]["data"] = {**events[-1]["data"], "witness": "none"}
    return "bundle_checkpoint"


@pytest.mark.parametrize("edit", [_edit_time, _edit_source, _zero_root, _bogus_schema, _extra_field])
def test_bundle_fields_the_package_promises_are_bound_even_re_signed(
    tmp_path: Path, exported: tuple[Path, Path], edit: Any
) -> None:
    """auditor-package.md: time = the trace entry's at, source = urn:drawbridge:gateway:<origin>, and the
    checkpoint event {schema, origin, tree_size, root_hash, note, covers}. Each edited, the bundle and the
    package re-signed with the evidence directory's own attestation key: verify-export still fails."""
    evidence, package = exported
    files = _files(package)
    events = _events(files)
    check = edit(events)
    code, report = _cli_verify(_written(tmp_path, _re_signed(files, events, evidence)), evidence)
    failed = _failed(report)
    assert code == 1 and check in failed, report["checks"]
    assert not {"export_attestation", "bundle_integrity", "bundle_attestation"} & set(failed), failed


@pytest.mark.parametrize("field", ["run_id", "origin", "bundle_id", "tree_size", "covers"])
def test_the_export_statements_predicate_is_checked_against_the_package(exported: tuple[Path, Path], field: str) -> None:
    """The predicate an auditor reads ({run_id, origin, bundle_id, tree_size, covers}) is the package's own,
    even when the operator signs a statement of their choosing."""
    from drawbridge.evidence.dsse import export_statement
    from drawbridge.state.signing_keys import load_keys

    evidence, package = exported
    files = _files(package)
    statement = json.loads(base64.b64decode(json.loads(files["export.intoto.json"])["payload"]))
    wrong = {"run_id": "run-0-00000000", "origin": "elsewhere.example/gw", "bundle_id": "sha256:" + "0" * 64,
             "tree_size": statement["predicate"]["tree_size"] + 1, "covers": {"first_index": 0, "last_index": 0}}
    rest = {name: data for name, data in files.items() if name != "export.intoto.json"}
    envelope = sign_statement(export_statement(rest, {**statement["predicate"], field: wrong[field]}),
                              load_keys(evidence / "keys").attestation)
    failed = _failed(_verify({**rest, "export.intoto.json": envelope}, evidence))
    assert set(failed) == {"bundle_checkpoint"} and "predicate" in failed["bundle_checkpoint"], failed


def test_an_export_statement_that_states_no_predicate_fails(exported: tuple[Path, Path]) -> None:
    """A statement signed without its predicate states nothing of this package: it fails, never skips the check."""
    from drawbridge.evidence.dsse import export_statement
    from drawbridge.state.signing_keys import load_keys

    evidence, package = exported
    files = _files(package)
    statement = json.loads(base64.b64decode(json.loads(files["export.intoto.json"])["payload"]))
    rest = {name: data for name, data in files.items() if name != "export.intoto.json"}
    bare = export_statement(rest, statement["predicate"])
    del bare["predicate"]
    envelope = sign_statement(bare, load_keys(evidence / "keys").attestation)
    failed = _failed(_verify({**rest, "export.intoto.json": envelope}, evidence))
    assert set(failed) == {"bundle_checkpoint"} and "predicate" in failed["bundle_checkpoint"], failed


def test_reordered_bundle_records_are_reported_out_of_order(exported: tuple[Path, Path]) -> None:
    evidence, package = exported
    files = _files(package)
    events = _events(files)
    events[0], events[2] = events[2], events[0]  # two surface records swapped
    failed = _failed(_verify(_re_signed(files, events, evidence), evidence))
    assert "out of order" in failed["trace_binding"] and "0 bundle event(s)" not in failed["trace_binding"]


def test_an_inconsistent_audit_record_in_a_package_is_named(exported: tuple[Path, Path]) -> None:
    evidence, package = exported
    files = _files(package)
    record = {**_audit_record(), "binding_digest": "sha256:" + "0" * 64}
    forged = _re_signed(files, _events(files), evidence, {"github-audit-1.json": json.dumps(record).encode()})
    detail = _failed(_verify(forged, evidence))["side_effects"]
    assert "audit-import/github-audit-1.json" in detail and "record_inconsistent" in detail, detail
    assert "recorded above their evidence" not in detail


BAD_IMPORTS = {
    "typo.json": b'{"schema": "assay.provider_audit_record.v0",',
    "inconsistent.json": json.dumps({**_audit_record(), "binding_digest": "sha256:" + "0" * 64}).encode(),
    "other.json": b'{"schema": "something.else.v0"}',
    # Assay skips these as no JSON; read by json.loads's guesses they would bind (one package, two verdicts).
    "bom.json": b"\xef\xbb\xbf" + json.dumps(_audit_record()).encode(),
    "utf16.json": json.dumps(_audit_record()).encode("utf-16"),
    # A key given twice: the last would win, and bind; an auditor reading the first sees another subject.
    "dupkey.json": json.dumps(_audit_record()).encode().replace(
        b'"subject": {', b'"subject": {"action_class": "other", "verb": "x", "target": {}}, "subject": {', 1),
    "deep.json": b'{"schema": "assay.provider_audit_record.v0", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
}
BAD_IMPORT_REASONS = {
    "typo.json": "is not JSON", "inconsistent.json": "record_inconsistent", "other.json": "is not an audit record",
    "bom.json": "bom.json starts with a byte order mark", "utf16.json": "utf16.json is not UTF-8",
    "dupkey.json": 'dupkey.json is not strict JSON: the key "subject" appears twice in one object',
    "deep.json": "deep.json is not strict JSON: nesting is deeper than 64 levels, the depth limit",
}


@pytest.mark.parametrize("name", sorted(BAD_IMPORTS))
def test_export_refuses_an_audit_import_its_verify_export_would_reject(
    tmp_path: Path, exported: tuple[Path, Path], name: str
) -> None:
    evidence, package = exported
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "github-audit-1.json").write_text(json.dumps(_audit_record()))
    (audit / name).write_bytes(BAD_IMPORTS[name])
    done = cli("evidence", "export", "--evidence-dir", str(evidence), "--carriers", str(evidence / "carriers.ndjson"),
               "--audit-import", str(audit), "--out", str(tmp_path / "p"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(audit / name) in lines[0] and not (tmp_path / "p").exists()
    reason = BAD_IMPORT_REASONS[name]
    assert reason in lines[0], lines[0]
    # The same file in a package (re-signed by the operator) fails verify-export for the same reason.
    files = _files(package)
    forged = _re_signed(files, _events(files), evidence, {name: BAD_IMPORTS[name]})
    assert reason in _failed(_verify(forged, evidence))["side_effects"]


def _export(evidence: Path, out: Path, *imports: Path, output: str = "json") -> subprocess.CompletedProcess[str]:
    args = [arg for path in imports for arg in ("--audit-import", str(path))]
    return cli("evidence", "export", "--evidence-dir", str(evidence), "--carriers", str(evidence / "carriers.ndjson"),
               *args, "--out", str(out), "--format", output)


def test_export_holds_each_audit_record_once(tmp_path: Path, exported: tuple[Path, Path]) -> None:
    """The same path given twice is one import; a copy under another name is not exported again, and
    the summary says which; a package that holds a copy anyway (re-signed) counts it once."""
    evidence, package = exported
    audit = tmp_path / "audit"
    audit.mkdir()
    record = audit / "github-audit-1.json"
    record.write_text(json.dumps(_audit_record()))
    (audit / "replay.json").write_bytes(record.read_bytes())
    done = _export(evidence, tmp_path / "p", audit, record)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["audit_records"] == 1 and summary["audit_imports_skipped"] == [
        {"source": str(audit / "replay.json"), "reason": f"the same record as {record}: exported once"}]
    assert sorted(p.name for p in (tmp_path / "p" / "audit-import").iterdir()) == ["github-audit-1.json"]
    files = _files(package)
    copies = {"github-audit-1.json": record.read_bytes(), "replay.json": record.read_bytes()}
    report = _verify(_re_signed(files, _events(files), evidence, copies), evidence)
    side = next(check for check in report["checks"] if check["id"] == "side_effects")
    assert report["ok"] and side["detail"].endswith(
        "1 verified through 1 audit record(s) (1 more file(s) a copy of one, counted once)"), side


def test_two_audit_records_under_one_record_id_are_refused(tmp_path: Path, exported: tuple[Path, Path]) -> None:
    evidence, package = exported
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "a.json").write_text(json.dumps(_audit_record()))
    other = {**_audit_record(), "non_claims": []}
    (audit / "b.json").write_text(json.dumps(other))
    done = _export(evidence, tmp_path / "p", audit)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and not (tmp_path / "p").exists(), done.stderr
    assert f"{audit / 'a.json'} and {audit / 'b.json'} both hold record_id 'audit-1'" in lines[0], lines[0]
    files = _files(package)
    forged = _re_signed(files, _events(files), evidence, {"a.json": (audit / "a.json").read_bytes(),
                                                          "b.json": (audit / "b.json").read_bytes()})
    detail = _failed(_verify(forged, evidence))["side_effects"]
    assert "audit-import/a.json and audit-import/b.json both hold record_id 'audit-1'" in detail, detail


def test_export_says_how_many_audit_records_it_took_and_what_it_did_not_read(
    tmp_path: Path, exported: tuple[Path, Path]
) -> None:
    evidence, _package = exported
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "rec.JSON").write_text(json.dumps(_audit_record()))
    (audit / "recs.ndjson").write_text(json.dumps(_audit_record()) + "\n")
    (audit / "a\x1b[2J.txt").write_text("x")
    done = _export(evidence, tmp_path / "p", audit)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["audit_records"] == 0
    assert [(Path(s["source"]).name, s["reason"]) for s in summary["audit_imports_skipped"]] == [
        ("a\ufffd[2J.txt", "not a *.json file: not read"), ("rec.JSON", "not a *.json file: not read"),
        ("recs.ndjson", "not a *.json file: not read")]
    table = _export(evidence, tmp_path / "q", audit, output="table")
    assert table.returncode == 0 and "\x1b" not in table.stdout, table.stderr
    assert "audit records" in table.stdout and "rec.JSON" in table.stdout and "recs.ndjson" in table.stdout
    done = _export(evidence, tmp_path / "r", audit / "rec.JSON")  # a file named on its own is read
    assert done.returncode == 0 and json.loads(done.stdout)["audit_records"] == 1, done.stderr


def test_export_refuses_a_cut_trace_and_an_unsealed_run_does_not_verify(tmp_path: Path, exported: tuple[Path, Path]) -> None:
    evidence, _package = exported
    copy = tmp_path / "evidence"
    shutil.copytree(evidence, copy)
    trace = copy / "trace.ndjson"
    lines = trace.read_bytes().splitlines(keepends=True)
    trace.write_bytes(b"".join(lines[:-2]))
    done = cli("evidence", "export", "--evidence-dir", str(copy), "--carriers", str(copy / "carriers.ndjson"),
               "--out", str(tmp_path / "p1"))
    assert done.returncode == 1 and "cut tail" in done.stderr and not (tmp_path / "p1").exists()
    # The whole trace without its run_end, re-signed by the operator: exported, but never "verified".
    from drawbridge.evidence.merkle import MerkleTree
    from drawbridge.evidence.tlog import Checkpoint, sign_checkpoint, trace_leaf
    from drawbridge.state.checkpoint_files import checkpoint_line
    from drawbridge.state.signing_keys import load_keys

    unsealed = lines[:-1]
    trace.write_bytes(b"".join(unsealed))
    keys = load_keys(copy / "keys")
    note = sign_checkpoint(Checkpoint(keys.origin, len(unsealed), MerkleTree([trace_leaf(x) for x in unsealed]).root()),
                           keys.checkpoint)
    (copy / "checkpoint").write_text(note)
    (copy / "checkpoints.ndjson").write_bytes(checkpoint_line(len(unsealed), note))
    done = cli("evidence", "export", "--evidence-dir", str(copy), "--carriers", str(copy / "carriers.ndjson"),
               "--out", str(tmp_path / "p2"))
    assert done.returncode == 0 and "INCOMPLETE" in done.stdout
    done = cli("evidence", "verify-export", str(tmp_path / "p2"), "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and [c["id"] for c in report["checks"] if not c["ok"]] == ["run_sealed"]
    assert "incomplete: crash or cut (no run_end)" in _failed(report)["run_sealed"]
    assert "signer_identity" in report["claims_not_made"]  # the package's own keys were used
    assert cli("evidence", "export", "--evidence-dir", str(copy), "--out", str(tmp_path / "p3")).returncode == 2  # no --carriers
    again = cli("evidence", "export", "--evidence-dir", str(copy), "--carriers", str(copy / "carriers.ndjson"),
                "--out", str(tmp_path / "p2"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def _without_checkpoints(tmp_path: Path, evidence: Path) -> Path:
    copy = tmp_path / "evidence"
    shutil.copytree(evidence, copy)
    (copy / "checkpoint").unlink()
    (copy / "checkpoints.ndjson").unlink()
    return copy


def test_export_refuses_keys_of_another_origin_than_the_traces_runs(tmp_path: Path, exported: tuple[Path, Path]) -> None:
    """trace-chain.md, Keys: a log keeps its origin, and the gateway refuses keys of another at startup.
    Export refuses them the same way, even with the log's checkpoint files removed."""
    from drawbridge.state.signing_keys import load_keys, open_keys

    evidence, _package = exported
    copy = _without_checkpoints(tmp_path, evidence)
    other = open_keys(tmp_path / "other-keys")
    done = cli("evidence", "export", "--evidence-dir", str(copy), "--keys-dir", str(tmp_path / "other-keys"),
               "--carriers", str(copy / "carriers.ndjson"), "--out", str(tmp_path / "p"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"sign as origin {other.origin!r}" in lines[0]
    assert f"the trace was signed as origin {load_keys(evidence / 'keys').origin!r}" in lines[0]
    assert not (tmp_path / "p").exists() and not (copy / "checkpoint").exists()


def test_a_package_whose_runs_name_another_origin_than_its_signer_fails(
    tmp_path: Path, exported: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package an export without that refusal writes (the operator's own tool): every signature holds,
    but the trace's run_start names the log's origin, not the signer's. verify-export fails it."""
    from drawbridge.state import auditor_package
    from drawbridge.state.signing_keys import load_keys, open_keys

    evidence, _package = exported
    copy = _without_checkpoints(tmp_path, evidence)
    other = open_keys(tmp_path / "other-keys")
    monkeypatch.setattr(auditor_package, "refuse_other_origin", lambda *_args: None)
    files, _summary = auditor_package.build_package(copy, carriers_file=copy / "carriers.ndjson",
                                                    keys_dir=tmp_path / "other-keys")
    done = cli("evidence", "verify-export", str(_written(tmp_path, files)), "--vkey",
               str(tmp_path / "other-keys" / "checkpoint.vkey"), "--attestation-key",
               str(tmp_path / "other-keys" / "attestation.pub.pem"), "--format", "json")
    failed = _failed(json.loads(done.stdout))
    assert done.returncode == 1 and set(failed) == {"checkpoint"}, failed
    origin = load_keys(evidence / "keys").origin
    assert f"names origin {origin!r}, but trace/checkpoint is signed as origin {other.origin!r}" in failed["checkpoint"]


@pytest.mark.parametrize("name", ["bundle.tar.gz", "export.intoto.json"])
def test_a_package_lacking_a_file_is_named_and_refused_as_unreadable(
    tmp_path: Path, exported: tuple[Path, Path], name: str
) -> None:
    evidence, package = exported
    files = _files(package)
    del files[name]
    done = cli("evidence", "verify-export", str(_written(tmp_path, files)), "--vkey",
               str(evidence / "keys" / "checkpoint.vkey"), "--attestation-key", str(evidence / "keys" / "attestation.pub.pem"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and f"{name} is missing" in lines[0], done.stderr
    checks = {check["id"]: check for check in _verify(files, evidence)["checks"]}
    details = [check["detail"] for check in checks.values()]
    assert f"'{name}'" not in details and not [d for d in details if "None" in d], details  # no KeyError text
    if name == "bundle.tar.gz":
        assert checks["bundle_integrity"]["detail"] == checks["bundle_attestation"]["detail"] == "bundle.tar.gz is missing"
        assert not checks["tool_decision_truth"]["ok"] and not checks["side_effects"]["ok"]
        assert not checks["run_sealed"]["ok"] and "bundle does not verify" in checks["run_sealed"]["detail"]
    else:
        assert checks["export_attestation"]["detail"] == "export.intoto.json is missing"


def test_the_proofs_are_exactly_one_for_each_record_line_of_the_run(exported: tuple[Path, Path]) -> None:
    """auditor-package.md, Layout: trace/proofs/<i>.tlog-proof for each trace line that names a bundled
    record. Every proof removed, or a valid proof of a line that names none added, the package re-attested
    by the operator: tlog_proofs fails."""
    from drawbridge.evidence.chain import split_lines
    from drawbridge.evidence.merkle import MerkleTree
    from drawbridge.evidence.tlog import make_tlog_proof, trace_leaf

    evidence, package = exported
    files = _files(package)
    proofs = sorted(name for name in files if name.startswith("trace/proofs/"))
    assert len(proofs) == 4
    without = _re_attested({n: d for n, d in files.items() if n not in proofs}, evidence, files)
    failed = _failed(_verify(without, evidence))
    assert set(failed) == {"tlog_proofs"} and f"lacking {proofs[0]}" in failed["tlog_proofs"], failed
    lines = split_lines(files["trace/trace.ndjson"])
    note = files["trace/checkpoint"].decode()
    other = next(i for i in range(len(lines)) if f"trace/proofs/{i}.tlog-proof" not in files)
    proof = make_tlog_proof(MerkleTree([trace_leaf(line) for line in lines]), other, note, len(lines))
    extra = _re_attested({**files, f"trace/proofs/{other}.tlog-proof": proof.text.encode()}, evidence, files)
    failed = _failed(_verify(extra, evidence))
    assert set(failed) == {"tlog_proofs"} and f"not such a line trace/proofs/{other}.tlog-proof" in failed["tlog_proofs"]
