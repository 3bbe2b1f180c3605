"""The draft wire format (and the gRPC messages) carry trees exactly: kind, parents, counts, and
the draft distributions bit for bit; draft items carry the verify budget."""

import pytest
import torch

from specray.actors.messages import DraftItem, SeqSpec
from specray.cluster.pools.wire import decode_items, decode_proposals, encode_items, encode_proposals
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig


def proposals():
    g = torch.Generator().manual_seed(0)
    dense = torch.rand(3, 11, generator=g).softmax(-1)
    sparse = torch.zeros(4, 11)
    sparse[:, 2:5] = torch.rand(4, 3, generator=g)
    return [
        Proposal([1, 2, 3], dense),
        Proposal([]),
        Proposal([4, 5], parents=[-1, -1], kind="deterministic_tree"),
        Proposal([6, 7, 8, 9], sparse, parents=[-1, -1, 0, 1], kind="wor_tree"),
        Proposal([3, 4, 2], dense, parents=[-1, -1, 0], kind="iid", counts=[2, 1, 2]),
        Proposal([7, 8]),
    ]


def same(a: Proposal, b: Proposal) -> None:
    assert (a.draft_token_ids, a.parents, a.kind, a.counts) == (b.draft_token_ids, b.parents, b.kind, b.counts)
    assert (a.draft_probs is None) == (b.draft_probs is None)
    if a.draft_probs is not None:
        assert torch.equal(a.draft_probs, b.draft_probs)


def test_wire_round_trips_trees():
    sent = proposals()
    for a, b in zip(sent, decode_proposals(encode_proposals(sent)), strict=True):
        same(a, b)


def test_wire_items_carry_the_budget():
    items = [DraftItem("a/0", [1, 2], 3, SeqSpec(SamplingConfig(0.7, 5, 0.9), 11), verify_budget=6),
             DraftItem("b/0", [4], 2)]
    back = decode_items(encode_items(items))
    assert [i.verify_budget for i in back] == [6, None]
    assert back[0].spec.sampling == items[0].spec.sampling and back[0].committed_delta == [1, 2]


def test_grpc_messages_round_trip_trees():
    pytest.importorskip("grpc")
    from specray.cluster.pools.grpc_transport import (
        items_from_proto,
        items_to_proto,
        proposals_from_proto,
        proposals_to_proto,
    )

    sent = proposals()
    for a, b in zip(sent, proposals_from_proto(proposals_to_proto(sent)), strict=True):
        same(a, b)
    items = [DraftItem("a/0", [1, 2], 3, verify_budget=6), DraftItem("b/0", [4], 2)]
    assert [i.verify_budget for i in items_from_proto(items_to_proto(items))] == [6, None]


def test_proto_enum_follows_the_kinds():
    pytest.importorskip("grpc")
    from specray.kernels.proposal import KINDS
    from specray.protos.specray.v1 import drafter_pb2 as pb

    assert [pb.ProposalKind.Value(f"PROPOSAL_KIND_{k.upper()}") for k in KINDS] == list(range(len(KINDS)))
