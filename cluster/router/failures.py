"""A request that failed inside a worker. That is a bug, not the client's mistake: the router aborts
that request alone, retries the round for the others, and the client learns only a reference that
ties its error to the server log (never worker internals: actor ids, pids, addresses, tracebacks)."""

from __future__ import annotations

import logging
import uuid

log = logging.getLogger("specray.router")


class RequestFailed(RuntimeError):
    """Ends one request's stream; `__cause__` keeps the worker's error for in-process callers."""

    def __init__(self, reference: str):
        super().__init__(f"internal error while generating; this request was aborted, others were not "
                         f"affected (reference {reference}: the server log has the details)")
        self.reference = reference


def request_failed(request_id: str, error: BaseException) -> RequestFailed:
    """Log `error` under a fresh reference and return the client's side of it."""
    failure = RequestFailed(uuid.uuid4().hex[:12])
    log.error("request %s failed inside a worker (reference %s)", request_id, failure.reference,
              exc_info=(type(error), error, error.__traceback__))
    failure.__cause__ = error
    return failure
