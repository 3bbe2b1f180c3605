"""Tree rules (and VocabTrim drafts) through the engine at temperature 1 (DESIGN §8 tier 3): the
first two tokens a speculative round emits (accepted, recovered or bonus) follow the target's exact
joint distribution for every tree method, trimmed or not, and the biased "longest match over
independent samples" rule is detected."""

import numpy as np
import pytest
import torch

from specray import LLM, SamplingParams
from specray.kernels.verify import tree as verify_tree

from enumeration import longest_match_over_independent_samples
from router_helpers import chi2_joint as chi2
from router_helpers import exact_joint_of_tokens_2_and_3

pytestmark = pytest.mark.usefixtures("one_thread")

N = 4000
VOCAB = 97  # the peaky models' vocabulary
PROMPT = {"prompt_token_ids": [1, 17, 40, 23]}


TREES = {
    "rsd_c": {"kind": "rsd_c", "branching": [3, 2]},
    "rsd_s": {"kind": "rsd_s", "width": 3},
    "spectr": {"kind": "spectr", "k": 3},
    "topk": {"kind": "topk", "k": 3, "width": 3},
}



@pytest.fixture(scope="module")
def peaky(peaky_models):
    return peaky_models


@pytest.fixture(scope="module")
def want(peaky):
    joint = exact_joint_of_tokens_2_and_3(peaky[0], PROMPT)
    assert joint.shape == (VOCAB * VOCAB,) and abs(joint.sum() - 1) < 1e-6  # fp32 softmaxes
    return joint


def second_tokens(target, draft, tree, seed, **extra):
    """Tokens 2 and 3 of each request as one index (t2 * vocab_size + t3): token 1 comes from the
    prefill, and the first round's tree (depth 2) emits tokens 2 and 3 when it accepts, else the
    next round emits token 3."""
    cfg = ({"method": "aded", "num_speculative_tokens": 2} if tree == "aded"
           else {"model": str(draft), "num_speculative_tokens": 2, **({"tree": tree} if tree else {}), **extra})
    llm = LLM(str(target), speculative_config=cfg, kv_cache_tokens=1 << 14, max_num_seqs=128, seed=seed)
    outs = llm.generate([PROMPT] * N, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0 < accepted < drafted
    tokens = np.array([o.outputs[0].token_ids[1:3] for o in outs])  # [N, 2]
    return tokens[:, 0] * VOCAB + tokens[:, 1]


@pytest.mark.parametrize("tree", sorted(TREES))
def test_tree_sampling_is_lossless(peaky, want, tree):
    assert chi2(second_tokens(*peaky, TREES[tree], seed=1), want) > 1e-3


@pytest.fixture(scope="module")
def trimmed_draft(peaky, tmp_path_factory):
    """The peaky draft with a VocabTrim table that leaves out every third token, some of the
    target's mass among them, so recovered tokens off the subset are exercised."""
    import shutil

    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("peaky_draft_trimmed") / "draft"
    shutil.copytree(peaky[1], folder)
    keep = torch.tensor([t for t in range(VOCAB) if t % 3])  # [65]
    save_file({"token_ids": keep}, str(folder / "vocab_trim.safetensors"))
    return folder, set(keep.tolist())


@pytest.mark.parametrize("tree", sorted(TREES))
def test_trimmed_tree_sampling_is_lossless(peaky, want, trimmed_draft, tree):
    """VocabTrim under trees: every node's proposal is the subset softmax (RRS, K-SEQ, descent)."""
    folder, keep = trimmed_draft
    tokens = second_tokens(peaky[0], folder, TREES[tree], seed=5, draft_vocab_trim=len(keep))
    assert set(np.unique(tokens // VOCAB).tolist()) - keep, "tokens off the subset must still be emitted"
    assert chi2(tokens, want) > 1e-3


def test_trimmed_chain_sampling_is_lossless(peaky, want, trimmed_draft):
    """VocabTrim on a chain: the proposal is the subset softmax, recovered tokens come from the
    whole vocabulary; a negative control for this path lives in tests/kernels/test_vocab_trim.py."""
    folder, keep = trimmed_draft
    tokens = second_tokens(peaky[0], folder, None, seed=6, draft_vocab_trim=len(keep))
    assert set(np.unique(tokens // VOCAB).tolist()) - keep, "tokens off the subset must still be emitted"
    assert chi2(tokens, want) > 1e-3


def test_aded_sampling_is_lossless(peaky, want):
    """ADED's deterministic trees (learned online from each sequence) under descent."""
    assert chi2(second_tokens(*peaky, "aded", seed=3), want) > 1e-3


def test_negative_control_longest_match_is_detected(peaky, want, monkeypatch):
    exact = verify_tree.verify_tree

    def biased(rule, rows, proposal, draws):
        if rule == "descent":
            return longest_match_over_independent_samples(rows, proposal, draws)
        return exact(rule, rows, proposal, draws)

    monkeypatch.setattr(verify_tree, "verify_tree", biased)
    assert chi2(second_tokens(*peaky, TREES["topk"], seed=2), want) < 1e-6
