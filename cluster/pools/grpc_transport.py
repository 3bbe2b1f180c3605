"""The grpc draft transport: a `Drafter` service (protos/specray/v1/drafter.proto) hosting a
DraftEndpoint, so a draft pool can run outside the Ray cluster, and the router's client for it.

`specray drafter` serves one; `transport: {kind: grpc, drafter_address: host:port}` points the
router at it. Releases are queued and sent before the next Propose, so a release can never
overtake a proposal still in flight for the same sequence.
"""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import numpy as np
import torch

from specray.actors.messages import DraftItem, SeqSpec
from specray.cluster.pools.api import DraftUnavailable
from specray.cluster.pools.draft_endpoint import DraftEndpoint, TransportStats
from specray.kernels.proposal import KINDS, Proposal
from specray.kernels.sampling import SamplingConfig
from specray.protos.specray.v1 import drafter_pb2 as pb
from specray.protos.specray.v1 import drafter_pb2_grpc as pb_grpc


# -- messages <-> protos ----------------------------------------------------------------------
def items_to_proto(items: list[DraftItem]) -> pb.ProposeRequest:
    out = pb.ProposeRequest()
    for i in items:
        m = out.items.add(seq_id=str(i.seq_id), committed_delta=i.committed_delta,
                          num_draft_tokens=i.num_draft_tokens)
        if i.verify_budget is not None:
            m.verify_budget = i.verify_budget
        if i.features is not None:
            m.feature_rows = i.features.shape[0]
            m.features = i.features.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        if i.spec is not None:
            s = i.spec.sampling
            m.spec.CopyFrom(pb.DraftSeqSpec(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p))
            if i.spec.seed is not None:
                m.spec.seed = i.spec.seed
    return out


def items_from_proto(req: pb.ProposeRequest) -> list[DraftItem]:
    items = []
    for m in req.items:
        spec = None
        if m.HasField("spec"):
            sampling = SamplingConfig(m.spec.temperature, m.spec.top_k, m.spec.top_p)
            spec = SeqSpec(sampling, m.spec.seed if m.spec.HasField("seed") else None)
        budget = m.verify_budget if m.HasField("verify_budget") else None
        features = None
        if m.HasField("feature_rows"):
            flat = torch.frombuffer(bytearray(m.features), dtype=torch.float32)
            if m.feature_rows <= 0 or flat.numel() % m.feature_rows:
                raise ValueError(f"item {m.seq_id!r}: {flat.numel()} feature values for {m.feature_rows} rows")
            features = flat.view(m.feature_rows, -1)
        items.append(DraftItem(m.seq_id, list(m.committed_delta), m.num_draft_tokens, spec, budget, features))
    return items


def proposals_to_proto(proposals: list[Proposal]) -> pb.ProposeResponse:
    out = pb.ProposeResponse()
    for p in proposals:
        m = out.proposals.add(draft_token_ids=p.draft_token_ids, kind=KINDS.index(p.kind))
        if p.is_tree:
            m.parents.extend(p.tree_parents())
        if p.counts is not None:
            m.counts.extend(p.counts)
        if p.draft_probs is None or not p.draft_token_ids:
            continue
        probs = p.draft_probs.detach().to("cpu", torch.float32)  # [k, vocab_size]
        m.probs.vocab_size = probs.shape[1]
        mask = probs != 0
        if int(mask.sum()) * 3 <= probs.numel():  # sparse is exact and smaller
            m.probs.row_offsets.extend([0, *mask.sum(1).cumsum(0).tolist()])
            rows, cols = mask.nonzero(as_tuple=True)
            m.probs.indices.extend(cols.tolist())
            m.probs.values.extend(probs[rows, cols].tolist())
        else:
            m.probs.dense = probs.numpy().astype("<f4").tobytes()
    return out


def proposals_from_proto(resp: pb.ProposeResponse) -> list[Proposal]:
    out = []
    for m in resp.proposals:
        k, probs = len(m.draft_token_ids), None
        if m.HasField("probs"):
            vocab = m.probs.vocab_size
            if m.probs.dense:
                probs = torch.from_numpy(np.frombuffer(m.probs.dense, "<f4").copy()).view(k, vocab)
            else:
                counts = np.diff(np.asarray(m.probs.row_offsets))
                rows = torch.from_numpy(np.repeat(np.arange(k), counts))
                probs = torch.zeros(k, vocab)
                probs[rows, torch.tensor(list(m.probs.indices), dtype=torch.long)] = torch.tensor(
                    list(m.probs.values), dtype=torch.float32)
        kind = KINDS[m.kind]  # enum values follow KINDS' order
        out.append(Proposal(list(m.draft_token_ids), probs, list(m.parents) if kind != "chain" else None, kind,
                            list(m.counts) if kind == "iid" else None))
    return out


# -- server -----------------------------------------------------------------------------------
class DrafterServicer(pb_grpc.DrafterServicer):
    def __init__(self, endpoint: DraftEndpoint):
        self.endpoint = endpoint

    def Propose(self, request, context):
        if request.method and request.method != self.endpoint.method:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"this drafter serves method {self.endpoint.method!r}, "
                          f"the router drafts with {request.method!r}")
        try:
            with self.endpoint.lock:
                return proposals_to_proto(self.endpoint.worker.propose(items_from_proto(request)))
        except KeyError as e:  # a sequence this drafter never saw (it restarted): the router resyncs
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"unknown sequence {e}; resend with its spec")
        except (ValueError, AssertionError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e) or "malformed request")

    def Release(self, request, context):
        self.endpoint.release_many(list(request.seq_ids))
        return pb.ReleaseResponse()

    def Ping(self, request, context):
        return pb.PingResponse(method=self.endpoint.method, vocab_size=self.endpoint.vocab_size)


def serve_drafter(endpoint: DraftEndpoint, address: str = "[::]:0") -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 256 << 20),
                                  ("grpc.max_send_message_length", 256 << 20),
                                  ("grpc.so_reuseport", 0)])  # a taken port is an error, not shared
    pb_grpc.add_DrafterServicer_to_server(DrafterServicer(endpoint), server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # gRPC's own text points at GRPC_VERBOSITY; the address is what is wrong
        raise ValueError(f"cannot listen on {address}: not an address of this machine, or the port is "
                         "taken") from None
    server.start()
    return server, port


# -- router-side pool -------------------------------------------------------------------------
PROBE_TIMEOUT_S = 2.0  # a down drafter's Ping: a round never waits on it


class _GrpcPending:
    def __init__(self, pool: "GrpcDraftPool", future, sent: int):
        self.pool, self.future, self.sent, self.start = pool, future, sent, time.perf_counter()

    def result(self):
        try:
            resp = self.future.result()
        except grpc.RpcError as e:
            self.pool.down = True  # until a ping answers: a hung drafter cost every round its timeout
            raise DraftUnavailable(f"drafter at {self.pool.address}: {e.code().name} {e.details()}") from None
        self.pool.stats.record(self.sent, resp.ByteSize(), time.perf_counter() - self.start)
        return proposals_from_proto(resp)


class GrpcDraftPool:
    def __init__(self, address: str, timeout_s: float = 60.0, method: str | None = None, vocab_size: int = 0):
        self.address, self.timeout_s, self.method = address, timeout_s, method
        self.vocab_size = vocab_size  # the target's; 0: not checked
        # a restarted drafter is found within seconds (gRPC's default backoff grows to two minutes)
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 << 20),
                                                               ("grpc.max_send_message_length", 256 << 20),
                                                               ("grpc.initial_reconnect_backoff_ms", 500),
                                                               ("grpc.max_reconnect_backoff_ms", 2000)])
        self.stub = pb_grpc.DrafterStub(self.channel)
        self.stats = TransportStats()
        self._released: list[str] = []
        self.down = False  # a call failed: rounds are target-only until `_probe` answers
        self._probe = None  # the pending Ping of a drafter that is down

    def ready(self, timeout_s: float = 60.0) -> None:
        """The drafter answers, serving `method`: ValueError saying which is not so (a wrong address
        held start-up five minutes; a drafter of another method drafted unnoticed)."""
        try:
            pong = self.stub.Ping(pb.PingRequest(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as e:
            raise ValueError(f"no specray drafter answers at {self.address} ({e.code().name} within {timeout_s:g} "
                             "s): start `specray drafter` there, or fix transport.drafter_address") from None
        if self.method is not None and pong.method != self.method:
            raise ValueError(f"the drafter at {self.address} serves method {pong.method!r}; speculative_config asks "
                             f"for {self.method!r}: start it with --method {self.method}")
        if self._other_vocabulary(pong):
            raise ValueError(f"the drafter at {self.address} proposes over {pong.vocab_size} tokens, the target's "
                             f"vocabulary has {self.vocab_size}: start it with a draft of the target's tokenizer")

    def _other_vocabulary(self, pong) -> bool:
        return bool(self.vocab_size and pong.vocab_size and pong.vocab_size != self.vocab_size)

    def _check_back(self) -> None:
        """While down, one Ping at a time, never waited on: DraftUnavailable until it answers with
        the configured method (a drafter restarted with another is not used)."""
        if self._probe is None:
            self._probe = self.stub.Ping.future(pb.PingRequest(), timeout=PROBE_TIMEOUT_S)
        if not self._probe.done():
            raise DraftUnavailable(f"drafter at {self.address} does not answer", sent=False)
        probe, self._probe = self._probe, None
        try:
            pong = probe.result()
        except grpc.RpcError as e:
            raise DraftUnavailable(f"drafter at {self.address}: {e.code().name}", sent=False) from None
        if self.method is not None and pong.method != self.method:
            raise DraftUnavailable(f"the drafter at {self.address} now serves method {pong.method!r}, not "
                                   f"{self.method!r}: not used", sent=False)
        if self._other_vocabulary(pong):
            raise DraftUnavailable(f"the drafter at {self.address} now proposes over {pong.vocab_size} tokens: "
                                   "not used", sent=False)
        self.down = False

    def submit_propose(self, items) -> _GrpcPending:
        if self.down:
            self._check_back()
        try:
            if self._released:
                self.stub.Release(pb.ReleaseRequest(seq_ids=self._released), timeout=self.timeout_s)
                self._released = []
            request = items_to_proto(items)
            request.method = self.method or ""
            return _GrpcPending(self, self.stub.Propose.future(request, timeout=self.timeout_s), request.ByteSize())
        except grpc.RpcError as e:
            self.down = True
            raise DraftUnavailable(f"drafter at {self.address}: {e.code().name}") from None

    def release(self, seq_id) -> None:
        self._released.append(str(seq_id))

    def close(self) -> None:
        """Releases still queued go out first: the drafter would keep those sequences' state."""
        if self._released and not self.down:
            try:
                self.stub.Release(pb.ReleaseRequest(seq_ids=self._released), timeout=PROBE_TIMEOUT_S)
            except grpc.RpcError:
                pass  # a drafter gone: nothing to release
            self._released = []
        self.channel.close()
