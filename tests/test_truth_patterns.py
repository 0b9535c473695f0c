"""Assay tool-name patterns (evidence-formats.md §2.6): every rule, stated as a case."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.evidence.truth import matches_tool_pattern

CASES = [
    # no star: exact equality
    ("exec", "exec", True),
    ("exec", "exec_shell", False),
    ("exec", "my_exec", False),
    # both ends: substring of the inner part; empty inner matches everything
    ("*", "anything_at_all", True),
    ("*", "", True),
    ("**", "fs.read_file", True),
    ("***", "anything", True),
    ("*search*", "web_search_api", True),
    ("*search*", "search", True),
    ("*search*", "web_fetch", False),
    ("**search**", "web_search_api", True),  # all leading/trailing stars are stripped
    # interior stars inside the substring form stay literal
    ("*a*b*", "axbc", False),
    ("*a*b*", "xa*by", True),
    # trailing only: anchored prefix
    ("read_*", "read_file", True),
    ("read_*", "read_", True),
    ("read_*", "my_read_file", False),
    ("read_**", "read_file", True),
    # leading only: anchored suffix
    ("*_file", "read_file", True),
    ("*_file", "_file_reader", False),
    ("**_file", "read_file", True),
    # an interior star is a literal asterisk
    ("read_*_file", "read_config_file", False),
    ("read_*_file", "read_*_file", True),
    ("a*b*c", "abc", False),
    ("a*b*c", "a*b*c", True),
    # the empty pattern matches only the empty name
    ("", "", True),
    ("", "anything", False),
    # dot is an ordinary character; backslash is no escape
    ("fs.*", "fs.read", True),
    ("fs.*", "fsxread", False),
    ("file\\*name", "file*name", False),
    # case-sensitive
    ("Read_*", "read_file", False),
]


@pytest.mark.parametrize(("pattern", "name", "expected"), CASES)
def test_pattern_rules(pattern: str, name: str, expected: bool) -> None:
    assert matches_tool_pattern(pattern, name) is expected


names = st.text(alphabet="ab*._", max_size=8)


@given(names, names)
def test_starless_patterns_are_exact(pattern: str, name: str) -> None:
    pattern = pattern.replace("*", "")
    assert matches_tool_pattern(pattern, name) is (pattern == name)


@given(names)
def test_bare_star_and_double_star_match_every_name(name: str) -> None:
    assert matches_tool_pattern("*", name)
    assert matches_tool_pattern("**", name)


@given(st.text(alphabet="ab._", min_size=1, max_size=5), names)
def test_prefix_suffix_and_substring_forms(core: str, name: str) -> None:
    assert matches_tool_pattern(core + "*", name) is name.startswith(core)
    assert matches_tool_pattern("*" + core, name) is name.endswith(core)
    assert matches_tool_pattern("*" + core + "*", name) is (core in name)
