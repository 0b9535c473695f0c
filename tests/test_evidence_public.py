"""The public surface of drawbridge.evidence: every listed name imports and is what the README says."""

import drawbridge.evidence as evidence


def test_every_public_name_resolves():
    for name in evidence.__all__:
        assert getattr(evidence, name) is not None, name


def test_public_functions_work_together():
    decision = evidence.build_decision(
        server_id="github", tool_name="add_deploy_key",
        arguments={"owner": "acme", "repo": "api", "title": "ci", "key": "ssh-ed25519 AAAA"},
        params={}, effect="allow", status="success",
    )
    doc = evidence.build_surface([decision])
    report = evidence.verify_side_effects(doc, [])
    assert report["calls"][0]["level"] == "asserted"
    assert "ssh-ed25519" not in str(doc)
