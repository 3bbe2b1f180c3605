"""Sequences that end while the draft pool is down are released once it answers: a worker that
timed out is still alive, with their state and draft KV (the releases were dropped)."""

from specray.actors.messages import DraftItem
from specray.cluster.pools.dist_transport import DistDraftPool
from specray.cluster.pools.draft_endpoint import TransportStats
from specray.cluster.pools.ray_pools import RayDraftPool


class RecordedCalls:
    def __init__(self):
        self.sent = []

    def send_no_reply(self, actor, method, *args):
        self.sent.append((actor, method, *args))

    def submit(self, actor, method, *args, **kw):
        self.sent.append((actor, method))
        return "pending"


def test_the_ray_pool_holds_releases_while_down():
    pool = RayDraftPool.__new__(RayDraftPool)  # the pool's bookkeeping alone: no Ray actor behind it
    pool.actors, pool.calls, pool.stats, pool.propose_timeout_s = ["worker"], RecordedCalls(), TransportStats(), 1.0
    pool._rendezvous, pool._held_releases = None, []
    pool._revival = "a pending ping"  # down: the worker timed out
    pool.release("a/0")
    pool.release("b/0")
    assert pool.calls.sent == []
    pool._revival = None  # it answered
    assert pool.submit_propose([DraftItem("c/0", [1, 2], 1)]) == "pending"
    assert pool.calls.sent == [("worker", "release_many", ["a/0", "b/0"]), ("worker", "propose_bytes")]
    pool.release("c/0")  # up: at once
    assert pool.calls.sent[-1] == ("worker", "release_many", ["c/0"]) and pool._held_releases == []


def test_the_dist_pool_keeps_releases_while_its_link_is_down():
    pool = DistDraftPool.__new__(DistDraftPool)
    pool.channel, pool._released = None, []  # the link was lost
    pool.release("a/0")
    assert pool._released == ["a/0"]  # sent before the first propose after the reconnect
