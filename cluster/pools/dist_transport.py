"""The torch.distributed draft transport: router and draft worker form a two-rank process group
(gloo on CPU, NCCL on GPU) of their own, outside any default group, and exchange wire-format
messages point to point. Ray still places and restarts the draft actor; per-round traffic skips
Ray's object store.

Framing: every message is a length (int64) then a uint8 payload whose first byte is its kind.
The router speaks only when no reply is due (releases wait for the next propose), so the two
ends never block sending to each other.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
import uuid

import ray
import torch
import torch.distributed as dist

from specray.cluster.pools import wire
from specray.cluster.pools.api import DraftUnavailable
from specray.cluster.pools.builder import kill_worker, release_group, reserve, start_worker
from specray.cluster.pools.draft_endpoint import DraftEndpoint, TransportStats

PROPOSE, RELEASE = b"P", b"R"


class DistChannel:
    """One end of a two-rank group; rank 0 (the router) hosts the rendezvous store."""

    def __init__(self, address: str, rank: int, backend: str = "gloo", timeout_s: float = 60.0):
        host, port = address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, int(port), 2, rank == 0, timeout=timeout)
        self.rank, self.peer = rank, 1 - rank
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, rank, 2)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, 2, timeout)

    def send(self, payload: bytes) -> None:
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        body = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
        self.group.send([size], self.peer, 0).wait()
        self.group.send([body], self.peer, 1).wait()

    def recv(self) -> bytes:
        size = torch.empty(1, dtype=torch.int64, device=self.device)
        self.group.recv([size], self.peer, 0).wait()
        body = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)  # host sync: need the size
        self.group.recv([body], self.peer, 1).wait()
        return body.cpu().numpy().tobytes()


def serve_channel(endpoint: DraftEndpoint, channel: DistChannel) -> None:
    """The draft side's loop: answer proposes, apply releases, until the router goes away."""
    while True:
        try:
            message = channel.recv()
        except RuntimeError:  # the router closed or died: the actor stays, a new connect follows
            return
        kind, payload = message[:1], message[1:]
        if kind == PROPOSE:
            try:
                channel.send(endpoint.propose_bytes(payload))
            except RuntimeError:  # the router gave up on this link (a stopped worker resumed): as above
                return
        elif kind == RELEASE:
            endpoint.release_many(wire.decode_release(payload))


class DistDraftEndpoint(DraftEndpoint):
    """The draft actor of this transport: a DraftEndpoint that also serves a two-rank group."""

    channel: DistChannel | None = None

    def connect(self, address: str, backend: str, timeout_s: float) -> None:
        """Join the router's two-rank group as rank 1 and serve requests on a thread."""
        self.channel = DistChannel(address, rank=1, backend=backend, timeout_s=timeout_s)
        threading.Thread(target=serve_channel, args=(self, self.channel), name="specray-dist-draft",
                         daemon=True).start()


def _router_address(port: int | None = None) -> str:
    """This node's address and the rendezvous port: `port` (transport.master_port), else a free one."""
    if port is None:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"


class _DistPending:
    def __init__(self, pool: "DistDraftPool", sent: int):
        self.pool, self.sent, self.start = pool, sent, time.perf_counter()

    def result(self):
        if self.pool.channel is None:
            raise DraftUnavailable("torch.distributed draft link lost")
        try:
            reply = self.pool.channel.recv()
        except RuntimeError as e:
            raise self.pool.lost(e) from None
        self.pool.stats.record(self.sent, len(reply), time.perf_counter() - self.start)
        return wire.decode_proposals(reply)


class DistDraftPool:
    """A Ray-placed draft actor reached over torch.distributed point to point."""

    def __init__(self, spec, placement, timeout_s: float = 60.0, master_port: int | None = None):
        self.timeout_s, self.master_port = timeout_s, master_port
        self.backend = "nccl" if spec.device.startswith("cuda") and torch.cuda.is_available() else "gloo"
        self.group = reserve([placement.bundle()])
        self.name = f"specray-draft-{uuid.uuid4().hex[:8]}"
        self.actor = start_worker(DistDraftEndpoint.from_spec, spec, self.group, placement, max_restarts=-1,
                                  name=self.name)
        self.stats = TransportStats()
        self.channel: DistChannel | None = None
        self._released: list = []  # flushed before the next propose: both ends never send at once
        self._probe = None  # after a loss, the pending ping of the restarting actor
        self._connect()

    def _connect(self) -> None:
        self.address = _router_address(self.master_port)
        joined = self.actor.call.remote("connect", self.address, self.backend, self.timeout_s)
        self.channel = DistChannel(self.address, rank=0, backend=self.backend, timeout_s=self.timeout_s)
        ray.get(joined, timeout=self.timeout_s)

    def lost(self, error: Exception) -> DraftUnavailable:
        self.channel = None
        return DraftUnavailable(f"torch.distributed draft link lost: {error}")

    def ready(self, timeout_s: float = 300.0) -> None:
        ray.get(self.actor.call.remote("ping"), timeout=timeout_s)

    def submit_propose(self, items) -> _DistPending:
        if self.channel is None:
            self._reconnect()
        payload = PROPOSE + wire.encode_items(items)
        try:
            if self._released:
                self.channel.send(RELEASE + wire.encode_release(self._released))
                self._released = []
            self.channel.send(payload)
        except RuntimeError as e:
            raise self.lost(e) from None
        return _DistPending(self, len(payload))

    def _reconnect(self) -> None:
        """After a loss: once Ray has restarted the actor (one ping pending at a time, never waited
        on: waiting held every round half a second), rebuild the group."""
        if self._probe is None:
            self._probe = self.actor.call.remote("ping")
        done, _ = ray.wait([self._probe], timeout=0)
        if not done:
            raise DraftUnavailable("draft worker is restarting", sent=False)
        self._probe = None
        try:
            ray.get(done[0])
            self._connect()
        except Exception as e:  # noqa: BLE001 - any failure means: not yet
            self.channel = None
            raise DraftUnavailable(f"draft worker not reachable yet: {e}", sent=False) from None

    def release(self, seq_id) -> None:
        """Sent before the next propose, after a reconnect too: a worker that timed out is still
        alive, with the sequence's state (a restarted one ignores ids it never saw)."""
        self._released.append(seq_id)

    def node_id(self) -> str:
        return ray.get(self.actor.node_id.remote())

    def worker_names(self) -> list[str]:
        return [self.name]

    def close(self) -> None:
        self.channel = None
        kill_worker(self.actor)
        release_group(self.group)

