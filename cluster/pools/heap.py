"""A serving process's objects from start-up (modules, the model, the tokenizer: some 400,000 in a
Serve replica), set aside from Python's cyclic collector once the process is built.

A full collection walks every tracked object: about 200 ms in a replica, during which its rounds
and streams stand still (docs/performance.md); requests' own objects come and go and are still
collected. Only for processes specray owns (the Serve replica, the pools' worker hosts, `specray
drafter`): `LLM` in a user's process leaves the user's collector alone.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what start-up left unreachable, then freeze every object still alive (gc.freeze);
    returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
