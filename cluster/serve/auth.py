"""The API-key check both APIs share: `Authorization: Bearer <key>`, compared in constant time."""

from __future__ import annotations

import hmac


def authorized(sent: str | bytes | None, api_key: str | None) -> bool:
    """True when no key is required, or `sent` (the authorization header or metadata) carries it."""
    if not api_key:
        return True
    if isinstance(sent, bytes):
        sent = sent.decode("utf-8", "replace")
    scheme, _, token = (sent or "").partition(" ")
    token = token.lstrip(" ")  # one or more spaces after the scheme (RFC 9110)
    ok = hmac.compare_digest(token.encode(), api_key.encode())
    return ok and scheme.lower() == "bearer"  # the scheme's case is free (RFC 9110), the key's is not
