"""The torch.distributed draft link (gloo, two ranks in threads of this process, no Ray): a draft
reply still due when the target is lost is read before the next call, so neither end waits."""

import socket
import threading
import time

from specray.actors.messages import DraftItem
from specray.cluster.pools.dist_transport import DistChannel, DistDraftEndpoint, DistDraftPool
from specray.cluster.pools.draft_endpoint import TransportStats
from specray.cluster.router.pipeline import Pipeline
from specray.kernels.proposal import Proposal

TIMEOUT_S = 5.0


class NumberedDrafts:
    """A draft worker whose proposal is its sequence's number: which sequence a reply answers."""

    def propose(self, items):
        return [Proposal([int(i.seq_id.split("/")[0][3:])]) for i in items]

    def release(self, seq_id):
        pass


def linked_pool() -> DistDraftPool:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    endpoint = DistDraftEndpoint(NumberedDrafts(), "ngram")
    draft_side = threading.Thread(target=endpoint.connect, args=(address, "gloo", TIMEOUT_S), daemon=True)
    draft_side.start()
    pool = DistDraftPool.__new__(DistDraftPool)  # the link alone: no Ray actor behind it
    pool.timeout_s, pool.stats, pool._released, pool._probe = TIMEOUT_S, TransportStats(), [], None
    pool.channel = DistChannel(address, rank=0, backend="gloo", timeout_s=TIMEOUT_S)
    draft_side.join()
    return pool


def test_a_lost_target_leaves_no_draft_reply_unread():
    """Before: the pipeline forgot group B's proposal in flight, the next call sent B's releases while
    the draft side was still sending that reply, and both ends blocked until the timeout (60 s served)."""
    pool = linked_pool()

    class Collects:  # the router's part a reset uses: it reads the proposals and drops them
        def collect_proposals(self, seqs, pending):
            return pending.result()

    pipeline = Pipeline(router=Collects())
    pipeline.drafting = ([], pool.submit_propose([DraftItem("req1/0", [1, 2], 1), DraftItem("req2/0", [3], 1)]))
    pool.release("req1/0")  # the lost target's sequences end
    pool.release("req2/0")
    pipeline.reset()
    start = time.monotonic()
    proposals = pool.submit_propose([DraftItem("req7/0", [5], 1), DraftItem("req8/0", [6], 1)]).result()
    assert [p.draft_token_ids for p in proposals] == [[7], [8]]  # the new group's own replies
    assert time.monotonic() - start < TIMEOUT_S / 2 and pipeline.drafting is None
