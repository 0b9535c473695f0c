"""The pattern index of a policy finds exactly the rules a scan of every rule finds, in file order.

``Policy.rules_for_tool`` no longer tries every wildcard rule on every name; these tests compare it
with the scan it replaced (a rule naming only exact tools matches one of its names; any other rule
matches when one of its patterns' ``matches`` says so) on generated policies and names, with mesh7
globs of every kind and the Assay pattern kinds mixed in.
"""

from __future__ import annotations


import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.policy import Action, GlobError, PolicySource, compile_glob, evaluate, load_policies
from drawbridge.policy.assay import AssayPattern, OutsidePattern
from drawbridge.policy.globs import Glob
from drawbridge.policy.model import Policy, Rule

ALPHABET = "ab./*?[]^-\\"
NAME_ALPHABET = "ab./*?[]\\-"


def _scan(policy: Policy, tool: str) -> tuple[int, ...]:
    """The reference: every rule tried in file order."""
    found = []
    for rule in policy.rules:
        if all(p.exact_value is not None for p in rule.tools):
            if any(p.exact_value == tool for p in rule.tools):
                found.append(rule.index)
        elif any(p.matches(tool) for p in rule.tools):
            found.append(rule.index)
    return tuple(found)


def _glob_or_none(text: str):
    try:
        return compile_glob(text)
    except GlobError:
        return None


globs = st.text(alphabet=ALPHABET, min_size=1, max_size=6).map(_glob_or_none).filter(lambda g: g is not None)
assay_patterns = st.text(alphabet="ab.*", max_size=5).map(AssayPattern)
leaf_patterns = st.one_of(globs, globs, globs, assay_patterns, st.just(compile_glob("*")))
patterns = st.one_of(
    leaf_patterns,
    st.lists(leaf_patterns, min_size=1, max_size=3).map(lambda inside: OutsidePattern("outside", tuple(inside))),
)
names = st.one_of(
    st.text(alphabet=NAME_ALPHABET, max_size=7),
    globs.map(lambda g: g.text),  # a name equal to a pattern's text
    globs.map(lambda g: g.literal_prefix),
)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    rule_patterns = draw(st.lists(st.lists(patterns, min_size=1, max_size=3), min_size=1, max_size=12))
    rules = tuple(
        Rule(index=i, line=i + 4, tools=tuple(tools), action=Action.ALLOW) for i, tools in enumerate(rule_patterns)
    )
    return Policy(name="p", agent=compile_glob("*"), rules=rules, schemas={}, source_file="p.yaml")


@settings(max_examples=examples(200), deadline=None)
@given(policies(), st.lists(names, min_size=1, max_size=8))
def test_rules_for_tool_equals_a_scan_of_every_rule(policy: Policy, tools: list[str]) -> None:
    for tool in tools:
        found = policy.rules_for_tool(tool)
        assert tuple(rule.index for rule in found) == _scan(policy, tool), tool
        assert all(found[i] is policy.rules[found[i].index] for i in range(len(found)))


def test_the_quirks_of_glob_matching_are_kept() -> None:
    escaped = compile_glob("a\\*")  # one literal name, "a*"; a mesh7 glob also matches its own text
    klass = compile_glob("[ab]")  # a class: matches "a" and "b", and its own text "[ab]"
    star = compile_glob("x*")
    rules = (
        Rule(0, 4, (escaped,), Action.DENY),  # exact-only rule: its name only
        Rule(1, 5, (escaped, star), Action.DENY),  # mixed rule: every pattern's own matches
        Rule(2, 6, (klass,), Action.ALLOW),
        Rule(3, 7, (compile_glob("*"),), Action.ALLOW),
    )
    policy = Policy(name="p", agent=compile_glob("*"), rules=rules, schemas={}, source_file="p.yaml")
    expected = {"a*": (0, 1, 3), "a\\*": (1, 3), "[ab]": (2, 3), "a": (2, 3), "xy": (1, 3), "x/y": (3,), "": (3,)}
    for tool, indices in expected.items():
        assert tuple(r.index for r in policy.rules_for_tool(tool)) == indices, tool
        assert _scan(policy, tool) == indices, tool


def test_a_cold_decision_at_a_thousand_pattern_rules_tries_only_the_globs_of_its_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted, not timed (bench/overhead.py prints the times): a first decision for a name tries the
    globs filed under the literal prefixes it starts with, not the 999 rules a scan would try."""
    rules = "\n".join(f'  - tools: ["tool_{i}", "ns{i}.*"]\n    action: deny' for i in range(999))
    text = f'name: bench\nagent: "agent-*"\nrules:\n{rules}\n  - tools: ["echo"]\n    action: allow\n'
    policy_set = load_policies([PolicySource("bench.yaml", text)])
    tried: list[str] = []
    original = Glob.matches

    def matches(self: Glob, value: str) -> bool:
        if not value.startswith("agent-"):  # the policy's agent glob, once per new agent
            tried.append(value)
        return original(self, value)

    monkeypatch.setattr(Glob, "matches", matches)
    decision = evaluate(policy_set, "agent-x", "ns500.read", {})
    assert (decision.action, decision.rule_index) == (Action.DENY, 500)
    assert tried == ["ns500.read"]  # the one glob filed under "ns500."
    for i in range(50):  # a new agent each time: no memoised plan helps
        assert evaluate(policy_set, f"agent-{i}", "echo", {}).rule_index == 999
    assert tried == ["ns500.read"]
