"""The declared contract derived from native policies, and Assay files kept verbatim."""

from __future__ import annotations

from pathlib import Path

from drawbridge.evidence.truth import Evidence, decision_verdict, declared_policy_digest, parse_assay_policy
from drawbridge.policy.declared import declared_contract
from drawbridge.state.policy_files import load_policy_dir, load_policy_path

NATIVE = """\
name: ops
agent: "ops-*"
rules:
  - tools: ["list_*"]
    action: allow
  - tools: ["deploy"]
    action: human_approval
  - tools: ["drop_table"]
    action: deny
    when:
      - {arg: "table", op: "==", value: "users"}
  - tools: ["delete_*"]
    action: deny
  - tools: ["*"]
    action: deny
schemas:
  deploy: {type: object, required: [env]}
"""


def test_native_translation_table(tmp_path: Path) -> None:
    (tmp_path / "ops.yaml").write_text(NATIVE)
    contract = declared_contract(load_policy_dir(tmp_path), "ops-1")
    assert contract == {
        "version": "2.0",
        "tools": {
            "allow": ["list_*", "deploy"],
            "deny": ["delete_*"],
            "approval_required": ["deploy"],
        },
        "schemas": {"deploy": {"type": "object", "required": ["env"]}},
        "enforcement": {"unconstrained_tools": "allow"},
    }
    assert decision_verdict(contract, "list_repos", {}, "present", Evidence()) == "match"
    assert decision_verdict(contract, "delete_x", {}, "present", Evidence()) == "mismatch"
    assert decision_verdict(contract, "deploy", {"env": "prod"}, "present", Evidence()) == "incomplete"
    assert decision_verdict(contract, "deploy", {"env": "prod"}, "present", Evidence(approval_obtained=True)) == "match"


def test_agent_without_allow_rules_keeps_catch_all_deny(tmp_path: Path) -> None:
    (tmp_path / "ops.yaml").write_text(NATIVE)
    contract = declared_contract(load_policy_dir(tmp_path), "stranger")
    assert contract["tools"] == {}
    (tmp_path / "default.yaml").write_text('name: default\nagent: "*"\nrules:\n  - tools: ["*"]\n    action: deny\n')
    contract = declared_contract(load_policy_dir(tmp_path), "stranger")
    assert contract["tools"] == {"deny": ["*"]}
    assert decision_verdict(contract, "anything", {}, "present", Evidence()) == "mismatch"


def test_digest_is_stable_across_loads(tmp_path: Path) -> None:
    (tmp_path / "ops.yaml").write_text(NATIVE)
    first = declared_policy_digest(declared_contract(load_policy_dir(tmp_path), "ops-1"))
    second = declared_policy_digest(declared_contract(load_policy_dir(tmp_path), "ops-2"))
    assert first == second


def test_assay_file_is_its_own_contract(tmp_path: Path) -> None:
    text = (
        'version: "1"\ntools:\n  allow: [read_file, deploy]\n  deny: [delete_all]\n'
        "schemas:\n  deploy:\n    type: object\n    required: [env]\n"
        "    properties:\n      env: {enum: [staging, prod]}\n"
    )
    path = tmp_path / "assay.yaml"
    path.write_text(text)
    contract = declared_contract(load_policy_path(path), "any-agent")
    # The reference page's digest for this policy (evidence-formats.md §2.5, the vectors' "base").
    assert declared_policy_digest(contract) == declared_policy_digest(parse_assay_policy(text))
    assert declared_policy_digest(contract) == (
        "sha256:4c3c6a7a02a1877c0c68ea389e4c6234aff49db88827d3a8ef67d1e992e98e6f"
    )
