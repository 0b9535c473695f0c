"""RFC 8785 canonical JSON: the 31-vector corpus and the properties every digest relies on."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.canonical import (
    CanonicalizationError,
    canonical_bytes,
    canonicalize_text,
    hmac_sha256_hex,
    is_sha256_digest,
    is_valid_key_id,
    jcs_digest,
    parse_hmac_digest,
    parse_json,
    rust_trim,
    sanitize,
)

VECTORS = json.loads((Path(__file__).parent / "vectors" / "rfc8785-vectors.json").read_text(encoding="utf-8"))
CASES = {name: case for name, case in VECTORS.items() if not name.startswith("_")}


def test_corpus_has_31_vectors():
    assert len(CASES) == 31


@pytest.mark.parametrize("name", sorted(CASES))
def test_rfc8785_vector(name):
    case = CASES[name]
    assert canonicalize_text(case["input"]).decode("utf-8") == case["expected"], case["pins"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("9007199254740993", "9007199254740992"),
        ("18446744073709551615", "18446744073709552000"),
        ("-9223372036854775808", "-9223372036854776000"),
        ("1.0", "1"),
        ("-0", "0"),
        ("1e21", "1e+21"),
        ("1e-7", "1e-7"),
        ('{"\\u00e9":1,"z":2,"\\ud800\\udc00":3,"\\ue000":4}', '{"z":2,"é":1,"\U00010000":3,"\ue000":4}'),
        ('"\\u007f/\\u001f"', '"\x7f/\\u001f"'),
    ],
)
def test_assay_number_and_key_rules(source, expected):
    assert canonicalize_text(source).decode("utf-8") == expected


@pytest.mark.parametrize("source", ["NaN", "[Infinity]", "-Infinity", "{", "1e400"])
def test_non_json_is_refused(source):
    with pytest.raises(CanonicalizationError):
        canonical_bytes(parse_json(source))


def test_integers_beyond_doubles_are_refused():
    with pytest.raises(CanonicalizationError):
        canonical_bytes(10**400)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_canonicalization_is_idempotent(value):
    once = canonical_bytes(value)
    assert canonicalize_text(once) == once


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=8), st.randoms(use_true_random=False))
def test_key_order_does_not_matter(obj, rnd):
    items = list(obj.items())
    rnd.shuffle(items)
    assert canonical_bytes(dict(items)) == canonical_bytes(obj)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_round_trip_to_the_same_double(number):
    text = canonical_bytes(number).decode()
    assert float(text) == number or (number == 0 and float(text) == 0)
    assert not math.isnan(float(text))


def test_digest_forms():
    assert jcs_digest({"b": 1, "a": 2}) == "sha256:" + hashlib.sha256(b'{"a":2,"b":1}').hexdigest()
    assert is_sha256_digest("sha256:" + "0" * 64)
    assert not is_sha256_digest("sha256:" + "A" * 64)
    assert not is_sha256_digest("sha256:" + "0" * 63)
    assert not is_sha256_digest(None)
    assert is_valid_key_id("kid-v0.1_x") and not is_valid_key_id("kid v0") and not is_valid_key_id("")
    assert not is_valid_key_id("kíd")
    assert parse_hmac_digest("hmac-sha256:k1:" + "a" * 64) == ("k1", "a" * 64)
    assert parse_hmac_digest("hmac-sha256::" + "a" * 64) is None
    # RFC 4231 test case 2.
    assert hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )


def test_rust_trim_keeps_information_separators():
    # Python's strip() would remove U+001C..U+001F; Rust's trim() does not.
    assert rust_trim("\x1c a \u3000") == "\x1c a"
    assert rust_trim("\u2028\u00a0x\u0085") == "x"


def test_sanitize_replaces_cc_but_not_cf():
    assert sanitize("a\x00b\x1b[31m\x7f\x9f") == "a\ufffdb\ufffd[31m\ufffd\ufffd"
    assert sanitize("tab\tlf\ncr\r") == "tab\tlf\ncr\r"
    assert sanitize("rtl\u202e") == "rtl\u202e"
