"""A target split over 2 TargetWorker processes (torch.distributed, gloo) verifies exactly like one
worker: same logits (fp32, atol 1e-5), same VerifyResults (greedy and seeded sampling), KV in step."""

import pytest
import torch

from specray.actors.specs import TargetSpec
from specray.actors.target_worker import TargetWorker
from specray.kernels.tensor_parallel import free_init_method

from tp_helpers import join_ranks, run_script, start_ranks, tp_rank_main

pytestmark = pytest.mark.usefixtures("one_thread")

WORLD = 2



def single_worker(folder) -> TargetWorker:
    return TargetWorker.from_spec(TargetSpec(model=str(folder), num_blocks=64, block_size=4,
                                             enable_prefix_caching=True))


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_target):
    """vocab 97: the LM head is replicated; vocab 96 (tied): it is split by vocab rows, then gathered."""
    from helpers import save_tiny_llama

    tied = save_tiny_llama(tmp_path_factory.mktemp("tied_96"), seed=5, vocab_size=96, num_key_value_heads=4,
                           tie_word_embeddings=True)
    return {"replicated_head": str(tiny_target), "vocab_parallel": str(tied)}


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
    """-> {model: {"single": out, 0: rank-0 out, 1: rank-1 out}} from one spawn of both ranks."""
    out_dir = tmp_path_factory.mktemp("tp_out")
    ranks = start_ranks(tp_rank_main, WORLD, (WORLD, free_init_method(), models, str(out_dir)))
    try:
        singles = {name: run_script(single_worker(folder)) for name, folder in models.items()}  # meanwhile
    finally:
        join_ranks(ranks)
    return {name: {"single": singles[name],
                   **{r: torch.load(out_dir / f"{name}-{r}.pt", weights_only=False) for r in range(WORLD)}}
            for name in models}


def assert_same_results(got, want):
    """Tokens identical; logprobs over the same tokens, values within fp32 rounding of the all-reduce."""
    assert len(got) == len(want)
    for (step, seq, g), (want_step, want_seq, w) in zip(got, want, strict=True):
        assert (step, seq) == (want_step, want_seq)
        assert {**g, "logprobs": None} == {**w, "logprobs": None}, f"step {step}, sequence {seq}"
        assert (g["logprobs"] is None) == (w["logprobs"] is None)
        for g_entry, w_entry in zip(g["logprobs"] or [], w["logprobs"] or [], strict=True):
            assert g_entry.keys() == w_entry.keys()
            assert all(abs(g_entry[t] - w_entry[t]) <= 1e-5 for t in g_entry)


@pytest.mark.parametrize("name", ["replicated_head", "vocab_parallel"])
def test_ranks_verify_like_one_worker(runs, name):
    run = runs[name]
    for r in range(WORLD):
        assert run[r]["tp_info"] == (r, WORLD)
        assert_same_results(run[r]["results"], run["single"]["results"])  # greedy and seeded sampling
        assert run[r]["results"] == run[0]["results"]  # ranks agree bit for bit, logprobs included
        assert len(run[r]["logits"]) == len(run["single"]["logits"])
        for got, want in zip(run[r]["logits"], run["single"]["logits"], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for got0, got1 in zip(run[0]["logits"], run[1]["logits"], strict=True):
        assert torch.equal(got0, got1), "every rank must see the same bits"
    for seqs in (("g", "n"), ("d",)):  # greedy, and sampling with dense proposals
        rounds = [res for _, seq, res in run["single"]["results"] if seq in seqs and res["num_draft_tokens"]]
        assert any(res["accepted_token_ids"] for res in rounds), f"{seqs}: no draft token accepted"
        assert any(not res["is_bonus"] for res in rounds), f"{seqs}: no rejection (recovered token)"
    # "g" and "n" take the greedy oracles' first block from the prefix cache, on every rank alike
    hits = {seq: res["num_cached_tokens"] for step, seq, res in run[0]["results"] if res["num_cached_tokens"]}
    assert hits == {"g": 4, "n": 4}


@pytest.mark.parametrize("name", ["replicated_head", "vocab_parallel"])
def test_each_rank_keeps_its_kv_heads_in_step(runs, name):
    full = runs[name]["single"]["kv"]  # [num_layers, 2 * num_kv_heads, num_slots, head_dim]
    kv_heads = full.shape[1] // 2
    local = kv_heads // WORLD
    for r in range(WORLD):
        heads = list(range(r * local, (r + 1) * local))
        want = full[:, heads + [kv_heads + h for h in heads]]  # keys, then values, of rank r's heads
        assert runs[name][r]["kv"].shape == want.shape
        torch.testing.assert_close(runs[name][r]["kv"], want, atol=1e-5, rtol=0)


def test_indivisible_target_fails_before_the_rendezvous(tiny_target):
    """2 KV heads over 3 ranks: a clear error on every rank, not a hang waiting for the others."""
    spec = TargetSpec(model=str(tiny_target), tp_rank=0, tp_size=3, dist_init_method=free_init_method())
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        TargetWorker.from_spec(spec)


def test_bad_rank_is_a_clear_error(tiny_target):
    with pytest.raises(ValueError, match="tp_rank"):
        TargetSpec(model=str(tiny_target), tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="dist_backend"):
        TargetSpec(model=str(tiny_target), dist_backend="mpi")
