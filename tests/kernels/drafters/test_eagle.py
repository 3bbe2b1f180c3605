"""Feature-level (EAGLE-style) drafts: the target returns exact features for the positions it keeps,
the runtime drafter proposes exactly what the training module computes, and greedy speculation with
it equals the target token for token (sampled: tests/cluster/test_engine_sampling.py)."""

import pytest
import torch

from specray import LLM, SamplingParams
from specray.actors.messages import DraftItem, SeqSpec, TargetItem
from specray.actors.target_worker import TargetWorker
from specray.cluster.distill.eagle_model import EagleDraft, init_eagle
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.eagle import EagleDrafter, load_eagle
from specray.kernels.loader import _read_safetensors, load_model, resolve
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig

from eagle_helpers import save_tiny_eagle


@pytest.fixture(scope="module")
def tiny_eagle(tiny_target, tmp_path_factory):
    return save_tiny_eagle(tmp_path_factory.mktemp("eagle"), tiny_target, vocab_trim=torch.arange(96, -1, -1)[:60])


PROMPTS = [[1, 17, 40, 23], [1, 5, 9], [1, 88, 3, 3, 3, 70, 12, 44, 9], [1, 30]]


def reference_features(target, token_ids):
    """The target's post-norm final hidden states over a whole sequence, pure torch."""
    from specray.kernels.batch import RaggedBatch, SeqChunk

    model = load_model(resolve(str(target)), cpu_kernels=False)
    cache = model.make_cache(64)
    batch = RaggedBatch.build([SeqChunk("r", list(token_ids), 0)], cache)
    return model(batch, cache, reference=True, features=True)[1]  # [T, H]


def test_target_returns_the_features_of_the_positions_it_keeps(tiny_target):
    worker = TargetWorker(load_model(resolve(str(tiny_target))), num_blocks=64)
    spec = SeqSpec(SamplingConfig(0.0), features="hidden")
    prompt = [1, 17, 40, 23, 8]
    (first,) = worker.step([TargetItem("s", prompt, Proposal([]), spec)])
    assert first.features.shape == (len(prompt), 64)
    torch.testing.assert_close(first.features, reference_features(tiny_target, prompt), atol=1e-4, rtol=1e-4)
    # draft the target's own greedy continuation, then a wrong token: two accepted, one rejected
    ref = LLM(str(tiny_target)).generate({"prompt_token_ids": prompt},
                                          SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    t = ref[0].outputs[0].token_ids
    assert t[0] == first.next_token_id
    wrong = (t[3] + 1) % 97
    (res,) = worker.step([TargetItem("s", [t[0]], Proposal([t[1], t[2], wrong]))])
    assert res.accepted_token_ids == [t[1], t[2]] and res.features.shape == (3, 64)
    full = reference_features(tiny_target, prompt + t[:3])
    torch.testing.assert_close(res.features, full[len(prompt):], atol=1e-4, rtol=1e-4)


def test_first_proposal_matches_the_training_module(tiny_target, tmp_path):
    """Runtime (paged KV, ragged batch) and training (transformers layer) agree on the draft logits."""
    from safetensors.torch import load_file

    folder = save_tiny_eagle(tmp_path / "e", tiny_target)
    seq = [1, 17, 40, 23, 8, 61, 5]
    f = reference_features(tiny_target, seq)  # [T, H]
    ck = resolve(str(tiny_target))
    train = EagleDraft(init_eagle(_read_safetensors(ck.path), ck.hf_config()).config)
    train.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    target = _read_safetensors(ck.path)
    head = target["lm_head.weight"]
    with torch.no_grad():
        g = train(f[None, :-1], target["model.embed_tokens.weight"][seq[1:]][None], torch.ones(1, len(seq) - 1))
    want = g[0, -1] @ head.T  # [vocab]: the proposal for the token after seq
    drafter = EagleDrafter(load_eagle(folder, ck.path), num_blocks=64)
    req = DraftRequest("s", seq, 1, SamplingConfig(0.0), features=f[:-1])
    chunk, inputs = drafter._calibrate(req)
    logits, _ = drafter._step([chunk], inputs)
    torch.testing.assert_close(logits[0], want, atol=2e-4, rtol=2e-4)


def test_feature_rows_must_match_the_new_positions(tiny_target, tiny_eagle):
    drafter = EagleDrafter(load_eagle(tiny_eagle, resolve(str(tiny_target)).path), num_blocks=64)
    too_many = DraftRequest("s", [1, 2, 3], 2, SamplingConfig(0.0), features=torch.zeros(3, 64))
    with pytest.raises(ValueError, match="feature rows"):
        drafter.propose([too_many])
    # fewer rows (the draft side lost its state): zeros stand in, drafting goes on
    (p,) = drafter.propose([DraftRequest("t", [1, 2, 3, 4], 2, SamplingConfig(0.0), features=torch.zeros(1, 64))])
    assert len(p.draft_token_ids) == 2


def _expanded_greedy_drafts(drafter, requests):
    """What a greedy proposal drew before the trimmed path: argmax over [rows, vocab_size] logits
    that are -inf off the VocabTrim ids."""
    from specray.kernels.drafters.draft_model import sample_step

    def draw(reqs, active, logits, drafts, probs):
        full = torch.full((logits.shape[0], drafter.model.config.vocab_size), float("-inf"))
        full[:, drafter.token_ids] = logits
        sample_step(reqs, active, full, drafts, probs)

    drafter._draw = draw
    return [p.draft_token_ids for p in drafter.propose(requests)]


def test_greedy_drafts_over_trimmed_logits_equal_the_expanded_argmax(tiny_target, tiny_eagle):
    """VocabTrim ids stored in any order (this table descends): the greedy draw over the kept rows
    alone picks what the argmax over the whole vocabulary picks, ties included (lowest id)."""
    path = resolve(str(tiny_target)).path
    ids = torch.arange(96, -1, -1)[:60]
    fast, slow = (EagleDrafter(load_eagle(tiny_eagle, path), num_blocks=64, vocab_trim_ids=ids) for _ in range(2))
    assert fast.vocab.kept == sorted(ids.tolist())
    reqs = [DraftRequest(i, p, 4, SamplingConfig(0.0), features=torch.randn(len(p) - 1, 64,
                                                                            generator=torch.Generator().manual_seed(i)))
            for i, p in enumerate(PROMPTS)]
    got = [p.draft_token_ids for p in fast.propose(reqs)]
    assert got == _expanded_greedy_drafts(slow, reqs) and all(len(d) == 4 for d in got)
    drafts = [[]]
    tie = torch.zeros(1, 60)
    tie[0, [5, 20]] = 1.0  # kept rows 5 and 20 tie: token ids 42 and 57
    fast._draw([reqs[0]], [0], tie, drafts, [[]])
    assert drafts == [[fast.vocab.kept[5]]] and fast.vocab.kept[5] < fast.vocab.kept[20]


def test_bad_eagle_configs_are_refused(tiny_target, tiny_draft):
    with pytest.raises(ValueError, match="needs a draft 'model'"):
        LLM(str(tiny_target), speculative_config={"method": "eagle"})
    with pytest.raises(ValueError, match="not a feature-level draft"):
        LLM(str(tiny_target), speculative_config={"method": "eagle", "model": str(tiny_draft)})


def test_a_draft_another_method_serves_is_refused_naming_it():
    """The packaged drafts, each given to the wrong method, and the diffusion LM as a draft."""
    from specray.kernels.drafters.loading import resolve_draft

    with pytest.raises(ValueError, match="feature-level draft .*: use method 'eagle'"):
        resolve_draft("draft_model", "smollm2-135m-eagle")
    with pytest.raises(ValueError, match="standalone draft model, not a feature-level draft .*'draft_model'"):
        resolve_draft("eagle", "smollm2-135m-draft")
    with pytest.raises(ValueError, match="not a LongSpec draft"):
        resolve_draft("longspec", "smollm2-135m-eagle")
    with pytest.raises(ValueError, match="diffusion LM: .* cannot be a draft"):
        resolve_draft("draft_model", "smollm2-135m-dllm")
    resolve_draft("eagle", "smollm2-135m-eagle")
    resolve_draft("draft_model", "smollm2-135m-draft")


@pytest.mark.parametrize("k,pipelined,vocab_trim,blocks", [(1, False, 0, None), (3, False, None, None),
                                                           (3, True, 0, None), (4, True, None, None),
                                                           (2, False, None, "q4_1")])
def test_eagle_greedy_equals_target_token_for_token(tiny_target, tiny_eagle, k, pipelined, vocab_trim, blocks):
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_target)).generate(prompts, sp)]
    llm = LLM(str(tiny_target), pipelined=pipelined,
              speculative_config={"method": "eagle", "model": str(tiny_eagle), "num_speculative_tokens": k,
                                  "draft_vocab_trim": vocab_trim, "draft_quantization": blocks})
    outs = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0
    assert llm.draft.drafter.name == "eagle"
    if blocks is not None and llm.draft.drafter.model.packed_weights:  # C kernels built
        assert {p.kind for p in llm.draft.drafter.model.packed_weights.values()} == {blocks}


def test_wire_and_grpc_carry_features_bit_for_bit():
    from specray.cluster.pools.grpc_transport import items_from_proto, items_to_proto
    from specray.cluster.pools.wire import decode_items, encode_items

    f = torch.randn(3, 8)
    items = [DraftItem("a", [1, 2, 3, 4], 2, features=f), DraftItem("b", [5], 1), DraftItem("c", [6], 0, features=f[:1])]
    for back in (decode_items(encode_items(items)), items_from_proto(items_to_proto(items))):
        assert torch.equal(back[0].features, f) and back[1].features is None and torch.equal(back[2].features, f[:1])


@pytest.mark.parametrize("tree", [{"kind": "rsd_c", "branching": [2, 2, 1]}, {"kind": "rsd_s", "width": 2},
                                  {"kind": "spectr", "k": 2}, {"kind": "topk", "k": 2, "width": 3}])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eagle_trees_stay_lossless_and_reproducible(tiny_target, tiny_eagle, tree, temperature):
    """Greedy: every tree kind equals the target token for token. Sampled: seeded outputs repeat, and
    the rule picked from the proposal's kind verifies it (a mismatch would raise)."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    sp = SamplingParams(temperature=temperature, max_tokens=20, ignore_eos=True, seed=5)
    llm = LLM(str(tiny_target), speculative_config={"method": "eagle", "model": str(tiny_eagle),
                                                    "num_speculative_tokens": 3, "tree": tree})
    outs = llm.generate(prompts, sp)
    assert sum(o.metrics.num_draft_tokens for o in outs) > sum(o.metrics.num_rounds for o in outs)  # trees
    if temperature == 0.0:
        want = LLM(str(tiny_target)).generate(prompts, sp)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in want]
    else:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == [o.outputs[0].token_ids for o in outs]


def test_a_request_that_never_drafts_collects_no_features(tiny_target, tiny_eagle):
    """num_speculative_tokens 0 beside drafting requests: the target's features for every token of its
    life piled up on the router (and crossed the wire each step), though no draft would read them;
    its tokens are still the target's."""
    llm = LLM(str(tiny_target), speculative_config={"method": "eagle", "model": str(tiny_eagle),
                                                    "num_speculative_tokens": 3})
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    off = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, num_speculative_tokens=0)
    on = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    request_ids = [llm.router.add_request(p["prompt_token_ids"], sp) for p, sp in zip(prompts, (off, on))]
    done = {}
    for i in range(200):
        done.update((o.request_id, o.outputs[0].token_ids) for o in llm.router.step() if o.finished)
        if i == 8:
            kept = {s.request_id: sum(f.shape[0] for f in s.draft_features) for s in llm.router.running}
            assert set(kept) == set(request_ids) and kept[request_ids[0]] == 0
        if not llm.router.has_unfinished():
            break
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_target)).generate(prompts, on)]
    assert [done[r] for r in request_ids] == want
