"""Step costs by rows (kernels/row_costs.py): the table's arithmetic, the measurement leaving the
KV cache as it found it, and the per-machine cache."""

import json

import pytest

from specray.kernels import row_costs
from specray.kernels.row_costs import RowCosts


def test_costs_are_relative_to_one_row_and_linear_past_the_table():
    costs = RowCosts((2.0, 3.0, 5.0))
    assert [costs.cost(r) for r in (1, 2, 3)] == [1.0, 1.5, 2.5]
    assert costs.step_seconds(5) == 9.0 and costs.cost(5) == 4.5  # slope of the last two: 2 s a row
    assert RowCosts((2.0,)).step_seconds(3) == 6.0
    with pytest.raises(AssertionError):
        costs.cost(0)


def test_a_noisy_table_is_made_monotone_and_a_falling_one_refused():
    assert RowCosts.monotone([1.0, 0.9, 1.2, 1.1]).seconds == (1.0, 1.0, 1.2, 1.2)
    with pytest.raises(AssertionError):
        RowCosts((1.0, 0.9))
    with pytest.raises(AssertionError):
        RowCosts((0.0, 1.0))
    assert RowCosts.from_json(RowCosts((1.0, 2.0)).to_json()) == RowCosts((1.0, 2.0))


def test_measuring_leaves_the_cache_as_it_was(tiny_target):
    from specray.kernels.loader import load_model, resolve

    model = load_model(resolve(str(tiny_target)))
    cache = model.make_cache(64, 16)
    free = cache.num_free_blocks
    costs = row_costs.measure(model, cache, rows=4, context=20, repeats=2)
    assert len(costs.seconds) == 4 and costs.seconds[0] > 0
    assert cache.num_free_blocks == free and row_costs.SCRATCH_SEQ not in cache.tables
    small = model.make_cache(2, 16)  # 32 slots: a shorter table and context, no OutOfBlocksError
    assert len(row_costs.measure(model, small, repeats=1).seconds) == 16 and small.num_free_blocks == 2
    tiny = model.make_cache(1, 4)
    assert len(row_costs.measure(model, tiny, repeats=1).seconds) == 2


def test_a_pass_slowed_by_the_machine_does_not_count(tiny_target, monkeypatch):
    """Each row count keeps its fastest pass: most passes of the two-row step slowed down (a busy
    neighbour) leave its cost where the quiet pass put it."""
    from specray.kernels.loader import load_model, resolve

    model = load_model(resolve(str(tiny_target)))
    cache = model.make_cache(64, 16)
    clock = {"now": 0.0, "calls": 0}

    def step(batch, _cache):  # 1 ms a row; the two-row step 50 ms in passes 1-3 of 4 kept
        clock["calls"] += 1
        rows, kept_pass = batch.num_tokens, (clock["calls"] - 2) // 3  # call 1 prefills, 3 rows a pass
        clock["now"] += 0.05 if rows == 2 and kept_pass in (1, 2, 3) else 0.001 * rows

    fake = type("Fake", (), {"embed_tokens": model.embed_tokens, "config": model.config,
                             "__call__": staticmethod(step)})()
    monkeypatch.setattr(row_costs.time, "perf_counter", lambda: clock["now"])
    costs = row_costs.measure(fake, cache, rows=3, context=8, repeats=4)
    assert costs.seconds == pytest.approx((0.001, 0.002, 0.003))


def test_costs_are_measured_once_per_key(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return RowCosts((1.0, 1.5))

    first = row_costs.cached_costs("k", measure, tmp_path)
    again = row_costs.cached_costs("k", lambda: pytest.fail("measured twice"), tmp_path)
    assert first == again and len(calls) == 1
    (tmp_path / "row_costs" / "k.json").write_text("{not json")  # a broken file is measured again
    assert row_costs.cached_costs("k", measure, tmp_path) == first and len(calls) == 2
    assert json.loads((tmp_path / "row_costs" / "k.json").read_text())["seconds"] == [1.0, 1.5]


def test_the_key_names_the_setup(monkeypatch):
    import torch

    key = row_costs.cache_key("model-a", "fast")
    assert key == row_costs.cache_key("model-a", "fast") != row_costs.cache_key("model-a", "exact")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert row_costs.cache_key("model-a", "fast") != key
    finally:
        torch.set_num_threads(threads)


def test_the_target_worker_caches_its_costs(tiny_target, tmp_path, monkeypatch):
    from specray.actors.target_worker import TargetWorker
    from specray.kernels.loader import load_model, resolve

    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path))
    monkeypatch.setattr(row_costs, "ROWS", 3)
    worker = TargetWorker(load_model(resolve(str(tiny_target))), 64, 16, cost_key=(str(tiny_target), "exact"))
    seconds = worker.row_costs()
    assert len(seconds) == 3 and len(list((tmp_path / "row_costs").glob("*.json"))) == 1
    fresh = TargetWorker(worker.model, 64, 16, cost_key=(str(tiny_target), "exact"))
    monkeypatch.setattr(row_costs, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert fresh.row_costs() == seconds


def test_a_worker_tells_its_stored_costs_and_measures_when_asked(tiny_target, tmp_path, monkeypatch):
    from specray.actors.target_worker import TargetWorker
    from specray.kernels.loader import load_model, resolve

    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path))
    monkeypatch.setattr(row_costs, "ROWS", 3)
    model = load_model(resolve(str(tiny_target)))
    worker = TargetWorker(model, 64, 16, cost_key=(str(tiny_target), "exact"))
    assert worker.stored_row_costs() is None  # nothing on this node: never measures here
    seconds = worker.row_costs()
    assert TargetWorker(model, 64, 16, cost_key=(str(tiny_target), "exact")).stored_row_costs() == seconds
    measured = []
    monkeypatch.setattr(row_costs, "measure", lambda *a, **k: measured.append(1) or RowCosts((1.0, 2.0, 3.0)))
    assert worker.row_costs(True) == (1.0, 2.0, 3.0) and measured == [1]  # cached or not
    assert TargetWorker(model, 64, 16, cost_key=(str(tiny_target), "exact")).stored_row_costs() == (1.0, 2.0, 3.0)


def test_tensor_parallel_ranks_measure_together_or_not_at_all():
    """A rank whose node lacks the cached costs measured alone, its steps' collectives waiting for
    ranks that had returned theirs: the start-up hung."""
    from specray.cluster.pools.ray_pools import agreed_row_costs

    def ranks(stored):
        calls = []

        def every_rank(method, *args):
            calls.append((method, *args))
            return stored if method == "stored_row_costs" else [(2.0, 3.0)] * len(stored)
        return every_rank, calls

    every_rank, calls = ranks([(1.0, 1.5), (1.0, 1.6)])
    assert agreed_row_costs(every_rank) == (1.0, 1.5) and calls == [("stored_row_costs",)]
    every_rank, calls = ranks([(1.0, 1.5), None])
    assert agreed_row_costs(every_rank) == (2.0, 3.0) and calls == [("stored_row_costs",), ("row_costs", True)]
