"""cluster/pools/heap.py: a serving process's start-up objects leave the cyclic collector's walks,
what start-up left unreachable is collected first, and later garbage is still collected. Run in a
subprocess: freezing the test process's heap would keep its objects for the rest of the run."""

import subprocess
import sys
import textwrap


def test_start_up_objects_freeze_and_later_garbage_is_collected():
    code = textwrap.dedent("""
        import gc, weakref
        from specray.cluster.pools.heap import freeze_startup_heap

        class Node:
            pass

        def cycle():
            a, b = Node(), Node()
            a.other, b.other = b, a
            return weakref.ref(a)

        kept = [Node() for _ in range(1000)]
        before = cycle()  # garbage from start-up: collected before the freeze, not frozen with it
        frozen = freeze_startup_heap()
        assert before() is None and frozen >= 1000 and gc.get_freeze_count() == frozen
        assert not any(o is kept for o in gc.get_objects())  # out of the collector's walks
        after = cycle()
        gc.collect()
        assert after() is None  # a request's cycles are still collected
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
