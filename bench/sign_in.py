"""What checking a credential costs at ``/mcp``, per request: a static token, a JWT seen before
(remembered until it expires) and a JWT seen for the first time (PyJWT's signature check).

Run: ``.venv/bin/python bench/sign_in.py [N]``. The issuer's key is made here and handed to the key
store directly, so no network is involved and the figures are the check alone.
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Any

import anyio
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt import PyJWK
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from drawbridge.config import AgentToken
from drawbridge.config_oauth import IssuerConfig, OAuthConfig
from drawbridge.gateway.transports.http_auth import Authenticator, Identity
from drawbridge.gateway.transports.http_identity import HttpSettings

ISSUER = "https://login.example.com"
RESOURCE = "https://gateway.example.com/mcp"


def _keys() -> list[tuple[str, str, Any, dict[str, Any]]]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    return [
        ("RS256", "k-rsa", rsa_key, RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True)),
        ("ES256", "k-ec", ec_key, ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True)),
    ]


async def _time(label: str, n: int, check: Any) -> None:
    start = time.perf_counter()
    for i in range(n):
        assert isinstance(await check(i), Identity)
    per = (time.perf_counter() - start) / n * 1e6
    print(f"{label:<36} {per:8.1f} µs per request")


async def main(n: int) -> None:
    settings = HttpSettings(agents=(AgentToken("ops", "%064x" % 0),))
    oauth = OAuthConfig(issuers=(IssuerConfig(ISSUER, "https://login.example.com/keys"),), resource=RESOURCE)
    auth = Authenticator(settings, oauth, RESOURCE)
    assert auth.keys is not None
    store = auth.keys.issuers[ISSUER]
    now = int(time.time())
    for algorithm, kid, private, public in _keys():
        store._keys[kid] = PyJWK({**public, "kid": kid, "alg": algorithm})  # noqa: SLF001 -- no network in a bench
        claims = {"iss": ISSUER, "aud": RESOURCE, "sub": "agent-a", "exp": now + 600, "iat": now}
        fresh = [jwt.encode({**claims, "jti": str(i)}, private, algorithm, headers={"kid": kid}) for i in range(n)]
        await _time(f"JWT {algorithm}, first time", n, lambda i: auth.authenticate(f"Bearer {fresh[i]}", "bench"))
        await _time(f"JWT {algorithm}, seen before", n, lambda i: auth.authenticate(f"Bearer {fresh[0]}", "bench"))
    settings = HttpSettings(agents=(AgentToken("ops", hashlib.sha256(b"static").hexdigest()),))
    static = Authenticator(settings, oauth, RESOURCE)
    await _time("static token", n, lambda i: static.authenticate("Bearer static", "bench"))


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
