"""What the sync and asyncio clients share: channel credentials, call metadata, retry policy."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

DEFAULT_TARGET = "localhost:50051"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for calls that fail UNAVAILABLE (server starting or
    unreachable). A stream is retried only before its first message arrives."""

    max_attempts: int = 4  # 1 disables retries
    initial_backoff: float = 0.1  # seconds
    max_backoff: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        assert self.max_attempts >= 1 and 0 < self.initial_backoff <= self.max_backoff and self.multiplier >= 1

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (0-based): half fixed, half jitter."""
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


def credentials(tls: bool, root_certificates: bytes | str | Path | None) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for a plaintext channel. `root_certificates` (PEM bytes or a file
    path) implies TLS; without it TLS trusts the system roots."""
    if root_certificates is None and not tls:
        return None
    if isinstance(root_certificates, (str, Path)):
        root_certificates = Path(root_certificates).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=root_certificates)


def channel_options(server_name: str | None, extra: list[tuple[str, object]] | None) -> list[tuple[str, object]]:
    options = list(extra or [])
    if server_name:  # the name the TLS certificate is checked against, when it differs from the target's host
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    # Plain metadata rather than call credentials: those refuse plaintext channels.
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


class Deadline:
    """One deadline across a call's retries."""

    def __init__(self, timeout: float | None):
        self.end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    def allows(self, wait: float) -> bool:
        """Whether waiting `wait` seconds still leaves time for another attempt."""
        return self.end is None or time.monotonic() + wait < self.end


def should_retry(code: grpc.StatusCode, attempt: int, policy: RetryPolicy, deadline: Deadline,
                 wait: float) -> bool:
    return code in RETRY_CODES and attempt + 1 < policy.max_attempts and deadline.allows(wait)
