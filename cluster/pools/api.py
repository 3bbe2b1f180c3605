"""The router's view of the two pools: submit work, get a pending result, wait for it later.

Submitting and waiting are separate so the pipelined router can verify one group on the target
pool while the draft pool proposes for the other. In-process pools compute at submit time and
hand back a finished `Done`; Ray, torch.distributed and gRPC pools return real futures.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from specray.actors.diffusion_worker import DiffusionItem
from specray.actors.messages import DraftItem, TargetItem
from specray.kernels.diffusion.engine import DiffusionUpdate
from specray.kernels.proposal import Proposal, VerifyResult

T = TypeVar("T")


class Pending(Protocol[T]):
    def result(self) -> T: ...


class Done(Generic[T]):
    """A result that was ready at submit time (or an error to raise on `result`)."""

    def __init__(self, value: T | None = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class TargetPool(Protocol):
    def submit_step(self, items: list[TargetItem]) -> Pending[list[VerifyResult]]: ...
    def release(self, seq_id: object) -> None: ...


class DraftPool(Protocol):
    def submit_propose(self, items: list[DraftItem]) -> Pending[list[Proposal]]: ...
    def release(self, seq_id: object) -> None: ...


class DiffusionPool(Protocol):
    """Workers of a diffusion LM: start sequences and run one model call for the given ones."""

    def submit_step(self, new: list[DiffusionItem], seq_ids: list[object]) -> Pending[list[DiffusionUpdate]]: ...
    def release(self, seq_id: object) -> None: ...


class DraftUnavailable(RuntimeError):
    """The draft pool cannot propose right now (a worker died or is restarting). `sent`: False where
    the pool refused before sending anything (it knew it was down), so the drafter never saw the call's
    sequences and has nothing of theirs to release."""

    def __init__(self, message: str, sent: bool = True):
        super().__init__(message)
        self.sent = sent


class TargetUnavailable(RuntimeError):
    """A target worker failed: its in-flight sequences are lost; retrying the request is safe."""
