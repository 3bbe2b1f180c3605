"""What the sync and asyncio clients share: channel credentials, call metadata, retry policy."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

DEFAULT_TARGET = "localhost:9000"  # specray serve's gRPC port


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for calls that fail UNAVAILABLE (server starting or
    unreachable). A stream is retried only before its first message arrives."""

    max_attempts: int = 4  # 1 disables retries
    initial_backoff: float = 0.1  # seconds
    max_backoff: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (isinstance(self.max_attempts, int) and self.max_attempts >= 1):
            raise ValueError(f"RetryPolicy max_attempts must be an integer >= 1 (1: no retries), got {self.max_attempts!r}")
        if not (0 < self.initial_backoff <= self.max_backoff and self.multiplier >= 1):
            raise ValueError("RetryPolicy needs 0 < initial_backoff <= max_backoff and multiplier >= 1, got "
                             f"{self.initial_backoff!r}, {self.max_backoff!r}, {self.multiplier!r}")

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
    if isinstance(root_certificates, str) and root_certificates.lstrip().startswith("-----BEGIN"):
        root_certificates = root_certificates.encode()  # the PEM text itself, not a path
    elif isinstance(root_certificates, (str, Path)):
        root_certificates = Path(root_certificates).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=root_certificates)


def retry_policy(retry: RetryPolicy | None) -> RetryPolicy:
    """None: no retries."""
    if retry is None:
        return RetryPolicy(max_attempts=1)
    if not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy or None, got {type(retry).__name__}")
    return retry


def check_timeout(timeout) -> float | None:
    """A call's deadline in seconds: a number > 0, or None."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
    return timeout


# gRPC's client default is 4 MiB a message: a long answer with top logprobs, or a long prompt's
# prompt_logprobs in the stream's summary, passes it, and no retry could help
RECEIVE_UNLIMITED = ("grpc.max_receive_message_length", -1)


def channel_options(server_name: str | None, extra: list[tuple[str, object]] | None) -> list[tuple[str, object]]:
    options = list(extra or [])
    if all(key != RECEIVE_UNLIMITED[0] for key, _ in options):
        options.append(RECEIVE_UNLIMITED)
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


def retry_wait(code: grpc.StatusCode, attempt: int, policy: RetryPolicy, deadline: Deadline) -> float | None:
    """Seconds to wait before another attempt after failed attempt `attempt`; None: no retry (a code
    not retried, the attempts spent, or no time left after the wait)."""
    if code not in RETRY_CODES or attempt + 1 >= policy.max_attempts:
        return None
    wait = policy.backoff(attempt)
    return wait if deadline.allows(wait) else None


class StreamOnce:
    """A stream is one call: iterated once, its deltas kept for `collect()` after the loop (a second
    iteration ran the generation again, sampled differently)."""

    def __init__(self):
        self.started, self.ended, self.deltas = False, False, []

    def begin(self) -> None:
        if self.started:
            raise RuntimeError("this stream was already iterated; a stream is one call: collect() after the "
                               "loop gives its whole result, client.stream(...) starts another")
        self.started = True

    def seen(self, delta):
        self.deltas.append(delta)
        return delta

    def end(self) -> None:
        self.ended = True

    def all(self) -> list:
        """Every delta, once an iteration read the stream to its end."""
        if not self.ended:
            raise RuntimeError("the stream was left (or cancelled) before its end: its whole result is not here")
        return self.deltas
