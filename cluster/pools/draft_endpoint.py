"""A DraftWorker behind the wire format (cluster/pools/wire.py). It runs wherever the draft pool runs:
in a Ray actor (ray and torch_distributed transports) or in a `specray drafter` process (grpc)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from specray.actors.draft_worker import DraftWorker
from specray.actors.specs import DraftSpec
from specray.cluster.pools import wire
from specray.cluster.pools.compute_thread import OnComputeThread


@dataclass
class TransportStats:
    """Bytes and waits of the router <-> draft link (benchmarks read it)."""

    rounds: int = 0
    bytes_sent: int = 0  # router -> draft: items with calibration deltas
    bytes_received: int = 0  # draft -> router: proposals
    seconds: float = 0.0  # submit to result, draft compute included

    def record(self, sent: int, received: int, seconds: float) -> None:
        self.rounds += 1
        self.bytes_sent += sent
        self.bytes_received += received
        self.seconds += seconds


class DraftEndpoint:
    def __init__(self, worker: DraftWorker, method: str = "draft", vocab_size: int = 0):
        self.worker, self.method = worker, method
        self.vocab_size = vocab_size  # its proposal distributions' width; 0: a model-free method
        self.lock = threading.Lock()  # gRPC serves calls on a thread pool; the worker is single-threaded
        self.compute_seconds = 0.0

    @classmethod
    def from_spec(cls, spec: DraftSpec) -> "DraftEndpoint":
        """The worker on the process's compute thread: gRPC answers on a pool of threads."""
        return cls(OnComputeThread(DraftWorker.from_spec, spec), spec.method, proposal_vocab(spec))

    def ping(self) -> str:
        return self.method

    def busy(self) -> float:
        """Seconds spent answering proposals (wire format included): benchmarks split rounds with it."""
        return self.compute_seconds

    def propose_bytes(self, payload: bytes) -> bytes:
        with self.lock:
            start = time.perf_counter()
            out = wire.encode_proposals(self.worker.propose(wire.decode_items(payload)))
            self.compute_seconds += time.perf_counter() - start
            return out

    def release_many(self, seq_ids: list) -> None:
        with self.lock:
            for seq_id in seq_ids:
                self.worker.release(seq_id)


def proposal_vocab(spec: DraftSpec) -> int:
    """The vocabulary a drafter's distributions cover: its draft model's; 0 for a model-free method."""
    from specray.kernels.drafters.registry import METHODS
    from specray.kernels.loader import resolve

    if not METHODS[spec.method].needs_model or spec.model is None:
        return 0
    return int(resolve(spec.model).hf_config().vocab_size)
