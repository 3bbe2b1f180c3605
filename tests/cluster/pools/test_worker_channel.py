"""The same-node channel to a pool worker (cluster/pools/local_channel.py): replies by ticket, calls
in order, a worker's error or death, a timed-out call's late reply; and Ray pools whose workers
share the router's node use it with outputs equal to the in-process engine, through a killed
target or draft worker."""

import json
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest
from pool_helpers import GREEDY, PROMPTS, SAMPLED, config, in_process_outputs, make_engine, run

from specray.cluster.pools import compute_thread
from specray.cluster.pools.local_channel import Channel, ChannelClosed, ChannelPending, ChannelServer, WorkerError

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/conftest.py)


class Recorder:
    """A worker whose calls are logged: echo answers its arguments, sleep waits, fail raises."""

    def __init__(self):
        self.log = []
        self.threads = set()

    def __call__(self, method, *args):
        self.log.append((method, args))
        self.threads.add(threading.current_thread().name)
        if method == "sleep":
            time.sleep(args[0])
        if method == "fail":
            raise ValueError(f"bad item {args[0]}")
        if method == "unpicklable":
            return lambda: None
        return method, args


@pytest.fixture(params=["connection-thread", "compute-thread"])
def served(request):
    """A channel whose calls run on a thread of its own, or (as in a worker host) are read, run
    and answered on the process's compute thread."""
    worker = Recorder()
    server = ChannelServer(worker, watch=compute_thread.watch if request.param == "compute-thread" else None)
    return worker, server, Channel(server.address, server.authkey)


def test_a_watched_channel_runs_its_calls_on_the_compute_thread_between_other_calls():
    worker = Recorder()
    server = ChannelServer(worker, watch=compute_thread.watch)
    channel = Channel(server.address, server.authkey)
    assert channel.call("echo", 1) == ("echo", (1,))
    assert compute_thread.run(lambda: threading.current_thread().name) == "specray-compute"
    assert channel.call("echo", 2) == ("echo", (2,))
    assert worker.threads == {"specray-compute"}


def test_a_message_that_does_not_unpickle_closes_only_its_connection():
    """The compute thread drops the broken connection (its client sees it closed, as a dead
    worker's) and keeps serving the others and its own calls."""
    worker = Recorder()
    server = ChannelServer(worker, watch=compute_thread.watch)
    good, bad = Channel(server.address, server.authkey), Channel(server.address, server.authkey)
    bad.conn.send_bytes(b"not a pickle")
    with pytest.raises(ChannelClosed):
        bad.receive(bad.send("echo", 0), timeout_s=10)
    assert good.call("echo", 5) == ("echo", (5,))
    assert compute_thread.run(sum, [1, 2]) == 3


def test_replies_go_to_their_tickets_and_calls_run_in_order(served):
    worker, _, channel = served
    first = channel.send("echo", 1)
    channel.send("note", 2, reply=False)
    third = channel.send("echo", 3)
    assert channel.receive(third) == ("echo", (3,))
    assert channel.receive(first) == ("echo", (1,))
    assert worker.log == [("echo", (1,)), ("note", (2,)), ("echo", (3,))]


def test_a_worker_error_fails_that_call_only(served):
    _, _, channel = served
    with pytest.raises(WorkerError, match="ValueError: bad item 7"):
        channel.call("fail", 7)
    with pytest.raises(WorkerError, match="pickle"):
        channel.call("unpicklable")
    assert channel.call("echo", 8) == ("echo", (8,))


def test_a_timed_out_reply_never_answers_a_later_call(served):
    _, _, channel = served
    ticket = channel.send("sleep", 0.3)
    with pytest.raises(TimeoutError):
        channel.receive(ticket, timeout_s=0.02)
    assert channel.call("echo", 9) == ("echo", (9,))  # the sleep's late reply was dropped


def test_a_wrong_key_is_refused_and_the_server_keeps_serving(served):
    _, server, channel = served
    with pytest.raises(AuthenticationError):
        Client(server.address, family="AF_UNIX", authkey=b"x" * 32)
    assert channel.call("echo", 1) == ("echo", (1,))
    assert Channel(server.address, server.authkey).call("echo", 2) == ("echo", (2,))  # still accepting


def test_tensors_cross_as_raw_bytes_exactly():
    import pickle

    import torch

    from specray.cluster.pools.local_channel import dumps

    x = torch.randn(4, 6)
    tensors = [x, x.t(), x[:, 1:3], torch.randn(3).to(torch.bfloat16), torch.arange(5), torch.tensor(True),
               torch.tensor(2.5), torch.empty(0, 7), torch.tensor([float("nan"), -0.0, float("inf")])]
    back = pickle.loads(dumps({"nested": [(t, i) for i, t in enumerate(tensors)]}))["nested"]
    for t, (u, i) in zip(tensors, back, strict=True):
        assert u.dtype == t.dtype and u.shape == t.shape and u.is_contiguous()
        assert torch.equal(u.view(-1).view(torch.uint8) if u.numel() else u, t.contiguous().view(-1).view(torch.uint8)
                           if t.numel() else t)  # bit for bit, NaN and -0.0 included


SERVER = """
import json, time
from specray.cluster.pools.local_channel import ChannelServer
server = ChannelServer(lambda method, *args: time.sleep(60) if method == "sleep" else args)
print(json.dumps([server.address.encode("latin-1").hex(), server.authkey.hex()]), flush=True)
time.sleep(120)
"""


def test_a_dead_worker_closes_the_channel():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        address, key = json.loads(proc.stdout.readline())
        channel = Channel(bytes.fromhex(address).decode("latin-1"), bytes.fromhex(key))
        assert channel.call("echo", 4) == (4,)
        pending = ChannelPending(channel, channel.send("sleep"), lambda e: RuntimeError(f"lost: {e}"))
        proc.kill()
        with pytest.raises(RuntimeError, match="lost: the worker's channel is closed"):
            pending.result()
        with pytest.raises(ChannelClosed):
            channel.call("echo", 5)
    finally:
        proc.kill()
        proc.wait()


# -- Ray pools whose workers share the router's node ---------------------------------------------

def here():
    """Workers on the test process's node (tests/conftest.py's head advertises `driver_node`)."""
    from specray.cluster.pools.ray_pools import Placement

    return Placement({"driver_node": 1}, num_cpus=0.25)


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    return in_process_outputs(tiny_target, tiny_draft)


def pools(tiny_target, tiny_draft, channel: bool):
    from specray.cluster.config.worker_specs import serve_draft_spec, serve_target_spec
    from specray.cluster.pools.ray_pools import RayDraftPool, RayTargetPool

    cfg = config(tiny_target, tiny_draft)
    return (RayTargetPool(serve_target_spec(cfg), here(), channel=channel),
            RayDraftPool(serve_draft_spec(cfg), here(), channel=channel))


def test_channel_ray_never_opens_one():
    from specray.cluster.pools.worker_calls import WorkerCalls

    assert WorkerCalls(use_channel=False).get(actor=None) is None  # asks Ray nothing


def test_same_node_workers_take_the_channel_with_equal_outputs(ray_cluster, tiny_target, tiny_draft, reference):
    target, draft = pools(tiny_target, tiny_draft, True)
    try:
        router = make_engine(target, draft, tiny_target, pipelined=True)
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]
        assert [o.outputs[0].token_ids for o in run(router, [PROMPTS[0]] * 3, SAMPLED)] == reference[1]
        assert target.calls.channel is not None and draft.calls.channel is not None
        assert draft.stats.rounds > 0 and target.busy() > 0 and draft.busy() > 0
        frozen = lambda host: __import__("gc").get_freeze_count()  # noqa: E731 - pickled by value
        for actor in (target.actors[0], draft.actor):  # built, then frozen (cluster/pools/heap.py)
            assert ray.get(actor.__ray_call__.remote(frozen)) > 10_000
    finally:
        target.close()
        draft.close()


def test_killed_workers_behind_channels_recover(ray_cluster, tiny_target, tiny_draft, reference):
    """A killed draft costs speed only and its channel reopens on the restarted worker; a killed
    target fails its requests retryably and the fresh worker gets a fresh channel."""
    from specray.cluster.pools.api import TargetUnavailable

    target, draft = pools(tiny_target, tiny_draft, True)
    try:
        router = make_engine(target, draft, tiny_target, pipelined=True)
        ids = [router.add_request(p, GREEDY) for p in PROMPTS]
        for _ in range(3):
            router.step()
        ray.kill(draft.actor, no_restart=False)
        done = {}
        while router.has_unfinished():
            done.update({o.request_id: o for o in router.step() if o.finished})
        assert [done[i].outputs[0].token_ids for i in ids] == reference[0] and router.stats.draft_fallbacks >= 1
        deadline = time.monotonic() + 180
        while not draft.healthy:
            assert time.monotonic() < deadline, "the draft worker did not come back"
            time.sleep(0.2)
        drafted = router.stats.num_draft_tokens
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]
        assert router.stats.num_draft_tokens > drafted and draft.calls.channel is not None

        old = target.calls.channel
        router.add_request(PROMPTS[0], GREEDY)
        router.step()
        ray.kill(target.actors[0], no_restart=True)
        with pytest.raises(TargetUnavailable, match="retry"):
            for _ in range(50):
                router.step()
        router.fail_all()
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]
        assert target.calls.channel is not None and target.calls.channel is not old
    finally:
        target.close()
        draft.close()
