"""Workers built and called on the process's one compute thread (cluster/pools/compute_thread.py):
the thread count their build set holds for their calls, and a call from the compute thread itself
runs directly instead of waiting on itself."""

import socket
import threading
import time

import torch

from specray.cluster.pools.compute_thread import OnComputeThread, post, run, watch


class Probe:
    def __init__(self, threads: int):
        self.built_on = threading.current_thread()
        torch.set_num_threads(threads)  # per thread, as a worker's from_spec does

    def where(self) -> tuple[threading.Thread, int]:
        return threading.current_thread(), torch.get_num_threads()

    def nested(self) -> threading.Thread:
        return run(lambda: threading.current_thread())


def test_a_worker_is_built_and_called_on_one_thread_with_its_thread_count():
    before = run(torch.get_num_threads)
    mine = torch.get_num_threads()
    try:
        worker = OnComputeThread(Probe, 1)
        thread, threads = worker.where()
        assert thread is worker.built_on and thread is not threading.current_thread()
        assert threads == 1 and torch.get_num_threads() == mine  # the caller's count is its own
        assert worker.nested() is thread
        assert OnComputeThread(Probe, 1).built_on is thread  # every worker of the process shares it
    finally:
        run(torch.set_num_threads, before)


def test_a_task_that_queues_the_next_does_not_starve_the_watched_connections():
    """The router's rounds queue one another on this thread: a channel's call must still be served
    between two of them, not after the last."""
    mine, theirs = socket.socketpair()
    served_at, turns, chain_ended = [], [0], threading.Event()
    most = 5000

    def handle(conn) -> bool:
        conn.recv(1)
        served_at.append(turns[0])
        return False

    def turn():
        turns[0] += 1
        if served_at or turns[0] >= most:
            chain_ended.set()
        else:
            post(turn)

    def start():  # the byte is waiting before the chain begins
        theirs.send(b"x")
        turn()

    try:
        watch(mine, handle)
        run(start)
        assert chain_ended.wait(timeout=30)
        post(lambda: None).result(timeout=10)
    finally:
        theirs.close()
    assert served_at and served_at[0] < most


def test_waiting_sees_a_queued_call_and_a_readable_connection():
    """What lets the router's turn go on with its next round, or end it for other work."""
    from specray.cluster.pools.compute_thread import waiting

    mine, theirs = socket.socketpair()
    seen = []

    def look():
        seen.append(waiting())  # nothing else queued or readable
        post(lambda: None)
        seen.append(waiting())  # a call queued behind this one
        return True

    def readable(conn) -> bool:
        conn.recv(1)
        return False

    def sent_then_look() -> bool:  # on the compute thread, so the byte waits unread
        theirs.send(b"x")
        time.sleep(0.05)
        return waiting()

    try:
        assert run(look) is True
        post(lambda: None).result(timeout=10)  # the queued call ran
        watch(mine, readable)
        assert run(sent_then_look) is True
        post(lambda: None).result(timeout=10)
    finally:
        theirs.close()
    assert seen == [False, True]
