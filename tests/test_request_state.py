"""The sealed requestState of an approval question (2026-07-28).

Format, tamper evidence, binding to the call, expiry and key rotation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drawbridge.approval.request_state import (
    RequestStateError,
    RequestStateExpired,
    RequestStateForged,
    RequestStateMalformed,
    RequestStateMismatch,
    carried_upstream_state,
    issued_here,
    open_state,
    seal,
    seal_continuation,
)

KEY = bytes(range(32))
OLD_KEY = b"o" * 32
NEW_KEY = b"n" * 40
T0 = datetime(2026, 7, 28, 12, 0, 0, tzinfo=UTC)
EXPIRES = T0 + timedelta(seconds=300)
DIGEST = "hmac-sha256:k1:" + "ab" * 32
OTHER_DIGEST = "hmac-sha256:k1:" + "cd" * 32
APPROVAL = "0123456789abcdef"
NONCE = "nonce-0123456789abcdef"
BINDING = {"agent": "ci-bot", "tool": "fs.write_file", "args_digest": DIGEST}


def mint(key: bytes | list[bytes] = KEY, **overrides: object) -> str:
    fields: dict[str, object] = dict(BINDING, approval_id=APPROVAL, expires_at=EXPIRES, nonce=NONCE)
    fields.update(overrides)
    return seal(key, **fields)  # type: ignore[arg-type]


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def test_the_token_is_the_documented_format_recomputed_by_hand() -> None:
    derived = hmac.new(KEY, b"drawbridge/request_state/v1/hmac-key", hashlib.sha256).digest()
    payload = {
        "agent": "ci-bot",
        "approval_id": APPROVAL,
        "args_digest": DIGEST,
        "exp": "2026-07-28T12:05:00.000000Z",
        "kid": b64u(hmac.new(derived, b"drawbridge/request_state/v1/key-id", hashlib.sha256).digest()[:9]),
        "nonce": NONCE,
        "purpose": "drawbridge.approval.request_state.v1",
        "tool": "fs.write_file",
        "v": 1,
    }
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()  # JCS for ASCII + small ints
    signed = "dbrs1." + b64u(body)
    expected = signed + "." + b64u(hmac.new(derived, signed.encode(), hashlib.sha256).digest())
    assert mint() == expected


def test_round_trip_returns_the_bound_payload() -> None:
    opened = open_state(KEY, mint(), now=T0, **BINDING)
    assert (opened.agent, opened.tool, opened.args_digest) == ("ci-bot", "fs.write_file", DIGEST)
    assert opened.approval_id == APPROVAL
    assert opened.expires_at == EXPIRES
    assert opened.nonce == NONCE


def test_a_different_nonce_gives_a_different_token_for_the_same_question() -> None:
    assert mint(nonce="another-nonce-000000") != mint()


def test_a_forged_tag_is_refused() -> None:
    token = mint()
    signed, _ = token.rsplit(".", 1)
    forged = signed + "." + b64u(hmac.new(b"x" * 32, signed.encode(), hashlib.sha256).digest())
    with pytest.raises(RequestStateForged) as caught:
        open_state(KEY, forged, now=T0, **BINDING)
    assert caught.value.code == "forged"
    assert token not in str(caught.value) and signed not in str(caught.value)


def test_a_payload_rewritten_by_the_client_is_refused() -> None:
    token = mint()
    signed, tag = token.rsplit(".", 1)
    body = json.loads(base64.urlsafe_b64decode(signed[len("dbrs1."):] + "=="))
    body["exp"] = "2099-01-01T00:00:00.000000Z"
    rewritten = "dbrs1." + b64u(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()) + "." + tag
    with pytest.raises(RequestStateForged):
        open_state(KEY, rewritten, now=T0, **BINDING)


@settings(max_examples=200, deadline=None)
@given(position=st.integers(min_value=0), replacement=st.sampled_from("AQgw_-0z9."))
def test_a_changed_character_anywhere_is_refused(position: int, replacement: str) -> None:
    token = mint()
    index = position % len(token)
    if token[index] == replacement:
        replacement = "B" if replacement != "B" else "C"
    changed = token[:index] + replacement + token[index + 1:]
    with pytest.raises(RequestStateError) as caught:
        open_state(KEY, changed, now=T0, **BINDING)
    assert caught.value.code in ("forged", "malformed")


def test_every_flipped_bit_of_the_decoded_bytes_is_refused() -> None:
    token = mint()
    signed, tag_text = token.rsplit(".", 1)
    body = base64.urlsafe_b64decode(signed[len("dbrs1."):] + "==")
    tag = base64.urlsafe_b64decode(tag_text + "=")
    for i in range(len(body)):
        flipped = bytearray(body)
        flipped[i] ^= 0x01
        with pytest.raises((RequestStateForged, RequestStateMalformed)):
            open_state(KEY, "dbrs1." + b64u(bytes(flipped)) + "." + tag_text, now=T0, **BINDING)
    for i in range(len(tag)):
        flipped = bytearray(tag)
        flipped[i] ^= 0x80
        with pytest.raises(RequestStateForged):
            open_state(KEY, signed + "." + b64u(bytes(flipped)), now=T0, **BINDING)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "dbrs1.",
        "dbrs1.abc",
        "dbrs2.YQ.YQ",
        "dbrs1.YQ.YQ.YQ",
        "dbrs1.Y=.YQ",
        "dbrs1.YR.YQ",  # non-canonical base64url (trailing bits set)
        "dbrs1.éé.YQ",
        "x" * 10_000,
    ],
)
def test_malformed_tokens_are_refused_as_malformed(token: str) -> None:
    with pytest.raises(RequestStateMalformed):
        open_state(KEY, token, now=T0, **BINDING)


def test_non_text_token_is_malformed() -> None:
    with pytest.raises(RequestStateMalformed):
        open_state(KEY, {"state": "x"}, now=T0, **BINDING)


def test_a_validly_signed_payload_of_the_wrong_form_is_malformed() -> None:
    derived = hmac.new(KEY, b"drawbridge/request_state/v1/hmac-key", hashlib.sha256).digest()
    for payload in ({"v": 1}, {"v": 2, "purpose": "x"}, [1, 2]):
        signed = "dbrs1." + b64u(json.dumps(payload, separators=(",", ":")).encode())
        token = signed + "." + b64u(hmac.new(derived, signed.encode(), hashlib.sha256).digest())
        with pytest.raises(RequestStateMalformed):
            open_state(KEY, token, now=T0, **BINDING)


def test_expired_state_is_refused_at_and_after_the_expiry() -> None:
    token = mint()
    assert open_state(KEY, token, now=EXPIRES - timedelta(microseconds=1), **BINDING)
    for now in (EXPIRES, EXPIRES + timedelta(days=1)):
        with pytest.raises(RequestStateExpired):
            open_state(KEY, token, now=now, **BINDING)


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("agent", "other-bot", "agent"),
        ("tool", "fs.delete_file", "tool"),
        ("args_digest", OTHER_DIGEST, "arguments"),
    ],
)
def test_state_bound_to_another_call_is_refused_naming_what_differs(
    field: str, value: str, bound: str
) -> None:
    binding = dict(BINDING, **{field: value})
    with pytest.raises(RequestStateMismatch) as caught:
        open_state(KEY, mint(), now=T0, **binding)
    assert caught.value.bound == bound
    assert value not in str(caught.value)


def test_key_rotation_first_key_seals_every_key_opens() -> None:
    old_token = mint(OLD_KEY)
    # phase 1: [old, new] still seals with old
    assert mint([OLD_KEY, NEW_KEY]) == old_token
    # phase 2: [new, old] seals with new and still opens tokens minted under old
    new_token = mint([NEW_KEY, OLD_KEY])
    assert new_token != old_token
    assert open_state([NEW_KEY, OLD_KEY], old_token, now=T0, **BINDING).approval_id == APPROVAL
    assert open_state([NEW_KEY, OLD_KEY], new_token, now=T0, **BINDING).approval_id == APPROVAL
    # phase 3: [new] alone refuses what only the retired key signed
    with pytest.raises(RequestStateForged):
        open_state([NEW_KEY], old_token, now=T0, **BINDING)
    assert open_state([NEW_KEY], new_token, now=T0, **BINDING).approval_id == APPROVAL


@pytest.mark.parametrize("ring", [b"short", [KEY, b"short"], [], "a-text-key-of-32-characters-long!!"])
def test_weak_or_missing_keys_are_configuration_errors(ring: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        mint(ring)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "override",
    [
        {"approval_id": "XYZ"},
        {"nonce": "short"},
        {"args_digest": "not-a-digest"},
        {"agent": ""},
        {"expires_at": datetime(2026, 1, 1)},
    ],
)
def test_seal_refuses_what_it_could_not_bind_honestly(override: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        mint(**override)


def test_a_continuation_carries_the_upstreams_state_and_only_our_kid_is_ours() -> None:
    token = seal_continuation(KEY, **BINDING, approval_id=APPROVAL, expires_at=EXPIRES, nonce=NONCE,
                              upstream_state="upstream-opaque")
    opened = open_state(KEY, token, now=T0, **BINDING)
    assert opened.continuation and opened.upstream_state == "upstream-opaque"
    assert carried_upstream_state(token) == (True, "upstream-opaque")
    assert carried_upstream_state(mint()) == (False, None)
    assert not open_state(KEY, mint(), now=T0, **BINDING).continuation
    # Another gateway's state (another key) is not ours; a state we cannot read at all is ours, and refused.
    assert issued_here(KEY, token) and issued_here([OLD_KEY, KEY], token)
    assert not issued_here(OLD_KEY, token) and not issued_here(KEY, "upstream-opaque")
    assert issued_here(KEY, "dbrs1.bm90LWEtc3RhdGU.AAAA")
    for other in ({"args_digest": OTHER_DIGEST}, {"agent": "another-bot"}, {"tool": "fs.delete"}):
        with pytest.raises(RequestStateMismatch):
            open_state(KEY, token, now=T0, **{**BINDING, **other})
