"""The API-key check both APIs share: `Authorization: Bearer <key>`, compared in constant time."""

from __future__ import annotations

import hmac


def authorized(sent: str | bytes | None, api_key: str | None) -> bool:
    """True when no key is required, or `sent` (the authorization header or metadata) carries it."""
    if not api_key:
        return True
    if isinstance(sent, bytes):
        sent = sent.decode("utf-8", "replace")
    return hmac.compare_digest((sent or "").encode(), f"Bearer {api_key}".encode())
