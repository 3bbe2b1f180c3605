"""Static decoding (exact tiny cases), FreeDave equal to it token for token (many seeds, blocks, K,
batches, ragged prompts, both layouts), never more model calls, seeded determinism, the sampling
rule's distribution, and negative controls that a wrong rule fails."""

import pytest
import torch
from diffusion_helpers import MASK, save_tiny_dllm
from scipy.stats import chisquare

from specray.kernels.diffusion.decoding import (
    CanvasPlan,
    DecodeOptions,
    Scores,
    StepSampler,
    static_decode,
    static_step,
    transfer_counts,
)
from specray.kernels.diffusion.engine import DiffusionEngine
from specray.kernels.diffusion.freedave import accept, build_drafts
from specray.kernels.diffusion.weights import load_diffusion_model
from specray.kernels.sampling import SamplingConfig

V, M = 6, 5  # tiny vocabulary for hand-made cases; id 5 is the mask
GREEDY = StepSampler(SamplingConfig(0.0), seed=0, mask_token_id=M)


def _scores(logits, plan: CanvasPlan, sampler=GREEDY) -> Scores:
    logits = torch.tensor(logits, dtype=torch.float32)
    start = plan.prompt_len
    return Scores(logits, (start, start + logits.shape[0]), sampler)


def test_transfer_counts_and_plans():
    assert transfer_counts(8, 8) == [1] * 8
    assert transfer_counts(8, 3) == [3, 3, 2]
    assert transfer_counts(5, 2) == [3, 2]
    plan = CanvasPlan.for_request(prompt_len=3, max_tokens=10, options=DecodeOptions(block_length=4, steps_per_block=2))
    assert (plan.gen_length, plan.num_steps, plan.length) == (12, 6, 15)
    assert plan.block(0) == (3, 7) and plan.block(3) == (7, 11) and plan.window(1, 4) == (3, 15)
    assert plan.finalized_blocks(3) == 1 and plan.transfers(2) == 2


@pytest.mark.parametrize("kw, message", [
    (dict(block_length=0), "block_length"), (dict(block_length=4, steps_per_block=5), "steps_per_block"),
    (dict(steps_per_block=0), "steps_per_block"), (dict(num_drafts=0), "num_drafts"),
    (dict(num_drafts=1.5), "num_drafts"),
])
def test_bad_options_are_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        DecodeOptions(**kw)


def test_a_static_step_unmasks_the_most_confident_masked_positions():
    plan = CanvasPlan(prompt_len=1, gen_length=4, block_length=4, steps_per_block=2)  # 2 tokens a step
    canvas = torch.tensor([0, M, 3, M, M])  # position 2 is already decided
    # rows: positions 1..4; position 2 is the most confident but not masked; position 1 next; then a
    # tie between positions 3 and 4: the lower one wins
    logits = [[0, 7, 0, 0, 0, 0], [0, 0, 0, 9, 0, 0], [0, 0, 0, 0, 3, 0], [0, 0, 0, 0, 3, 0]]
    out = static_step(canvas, _scores(logits, plan), plan, 0, M)
    assert out.tolist() == [0, 1, 3, 4, M]
    # the mask token is never a candidate, however likely: the runner-up fills in
    out = static_step(canvas, _scores([[0, 0, 1, 0, 0, 50]] * 4, plan), plan, 0, M)
    assert out.tolist() == [0, 2, 3, 2, M]


def test_drafts_replay_static_steps_and_the_chain_accepts_while_targets_agree():
    plan = CanvasPlan(prompt_len=1, gen_length=3, block_length=3, steps_per_block=3)
    canvas = torch.tensor([0, M, M, M])
    first = _scores([[0, 5, 0, 0, 0, 0], [0, 0, 4, 0, 0, 0], [0, 0, 0, 3, 0, 0]], plan)
    drafts = build_drafts(canvas, first, plan, 0, 3, M)
    assert [d.tolist() for d in drafts] == [[0, 1, M, M], [0, 1, 2, M], [0, 1, 2, 3]]
    same = first  # logits that do not change: every draft is what static decoding reaches
    assert accept(drafts, [same, same, None], plan, 0, M) == 3
    # after draft 1 the model changes its mind at position 2: only draft 1 stands
    moved = _scores([[0, 5, 0, 0, 0, 0], [0, 0, 0, 0, 4, 0], [0, 0, 0, 3, 0, 0]], plan)
    assert accept(drafts, [moved, same, None], plan, 0, M) == 1
    # draft 2 agrees, draft 3 does not: two steps
    late = _scores([[0, 5, 0, 0, 0, 0], [0, 0, 4, 0, 0, 0], [0, 0, 0, 0, 3, 0]], plan)
    assert accept(drafts, [same, late, None], plan, 0, M) == 2


@pytest.fixture(scope="module", params=["llada", "dream"])
def dllm(request, tmp_path_factory):
    return load_diffusion_model(save_tiny_dllm(tmp_path_factory.mktemp(request.param), request.param, scale=6.0))


def _run(model, options: DecodeOptions, prompts, max_tokens, sampling, seeds, accept_rule=None):
    engine = DiffusionEngine(model, options)
    if accept_rule is not None:
        engine_accept = accept_rule
        import specray.kernels.diffusion.engine as engine_module
        original, engine_module.accept = engine_module.accept, engine_accept
    try:
        for i, p in enumerate(prompts):
            plan = CanvasPlan.for_request(len(p), max_tokens, options)
            engine.add(i, p, plan, StepSampler(sampling, seeds[i], MASK))
        out = {i: [] for i in range(len(prompts))}
        while any(not s.done for s in engine.seqs.values()):
            for update in engine.step():
                out[update.seq_id] += update.token_ids
    finally:
        if accept_rule is not None:
            engine_module.accept = original
    return out, engine.metrics


def _prompts(seed: int, batch: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, MASK, (int(n),), generator=g).tolist() for n in torch.randint(1, 14, (batch,), generator=g)]


CASES = [(8, 8, 16), (4, 2, 12), (8, 4, 20), (6, 3, 6), (5, 5, 15)]  # block length, steps per block, max tokens


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_freedave_equals_static_decoding_token_for_token(dllm, temperature):
    sampling = SamplingConfig(temperature, top_k=8 if temperature > 1 else 0)
    for case, (block, steps, max_tokens) in enumerate(CASES):
        for batch in (1, 3, 6):
            prompts, seeds = _prompts(case * 10 + batch, batch), [case * 100 + i for i in range(batch)]
            static = [static_decode(dllm, p, CanvasPlan.for_request(len(p), max_tokens, DecodeOptions(block, steps)),
                                    StepSampler(sampling, s, MASK)) for p, s in zip(prompts, seeds)]
            static_calls = sum(calls for _, calls in static)
            for k, adaptive in ((1, False), (2, False), (4, False), (8, False), (4, True)):
                out, metrics = _run(dllm, DecodeOptions(block, steps, k, adaptive), prompts, max_tokens, sampling, seeds)
                for i, (canvas, _) in enumerate(static):
                    assert out[i] == canvas[len(prompts[i]):].tolist(), (case, batch, k, i)
                calls = sum(metrics.per_seq_calls.values())
                assert calls <= static_calls and (k > 1 or calls == static_calls)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_freedave_equals_static_decoding_in_16_bit_weights(tmp_path, dtype):
    """Greedy, K = 4, ragged batches: a canvas's rows no longer depend on the call's other rows in 16
    bits either (they did, and FreeDave drifted from static decoding at the first near-tie)."""
    model = load_diffusion_model(save_tiny_dllm(tmp_path / "m", "llada", scale=6.0), dtype)
    greedy = SamplingConfig(0.0)
    for batch in (1, 6):
        prompts = _prompts(batch, batch)
        out, _ = _run(model, DecodeOptions(8, num_drafts=4), prompts, 32, greedy, [0] * batch)
        for i, p in enumerate(prompts):
            static, _ = static_decode(model, p, CanvasPlan.for_request(len(p), 32, DecodeOptions(8)),
                                      StepSampler(greedy, 0, MASK))
            assert out[i] == static[len(p):].tolist(), (batch, i)


def test_freedave_saves_calls_where_drafts_hold(dllm):
    """Sampling a peaky model: later drafts often agree, so the calls fall strictly below static's."""
    prompts = _prompts(7, 4)
    options = DecodeOptions(8, 8, 4)
    out, metrics = _run(dllm, options, prompts, 16, SamplingConfig(0.7), [1, 2, 3, 4])
    assert sum(metrics.per_seq_calls.values()) < 4 * 16
    assert metrics.steps == 4 * 16


def test_seeded_runs_repeat_and_seeds_matter(dllm):
    prompts = _prompts(3, 3)
    options = DecodeOptions(4, 4, 4)
    a, _ = _run(dllm, options, prompts, 12, SamplingConfig(1.0), [5, 6, 7])
    b, _ = _run(dllm, options, prompts, 12, SamplingConfig(1.0), [5, 6, 7])
    c, _ = _run(dllm, options, prompts, 12, SamplingConfig(1.0), [8, 9, 10])
    assert a == b and a != c


def test_negative_control_accepting_every_draft_changes_the_output(dllm):
    """A verifier that skips the chain (takes the furthest draft) must break equality somewhere."""
    def accept_all(drafts, scores, plan, step, mask):
        return len(drafts)

    broke = False
    for seed in range(6):
        prompts = _prompts(seed, 2)
        options = DecodeOptions(8, 8, 4)
        good, _ = _run(dllm, options, prompts, 16, SamplingConfig(0.0), [0, 1])
        bad, _ = _run(dllm, options, prompts, 16, SamplingConfig(0.0), [0, 1], accept_rule=accept_all)
        broke |= good != bad
    assert broke


def _chi2_pvalue(sampler: StepSampler, logits_row: torch.Tensor, expected: torch.Tensor, draws: int) -> float:
    counts = torch.zeros(V)
    rows = 2000
    for step in range(draws // rows):
        x0, _ = sampler.candidates(logits_row.expand(rows, V), step)
        counts += torch.bincount(x0, minlength=V).float()
    keep = expected > 0
    assert counts[~keep].sum() == 0
    return chisquare(counts[keep].numpy(), (expected[keep] * counts.sum()).numpy()).pvalue


def test_a_sampled_step_draws_candidates_from_the_processed_distribution():
    """Draws from the processed logits (temperature, top-k; mask excluded) at 10^5 draws,
    and a wrong temperature as the negative control."""
    logits = torch.tensor([1.0, 0.2, -0.5, 0.9, 0.0, 3.0])  # the mask (id 5) is the likeliest: never drawn
    for temperature, top_k in [(1.0, 0), (0.6, 0), (1.5, 3)]:
        sampler = StepSampler(SamplingConfig(temperature, top_k=top_k), seed=11, mask_token_id=M)
        z = logits.clone()
        z[M] = float("-inf")
        z = z / temperature
        if top_k:
            z[z < z.topk(top_k).values[-1]] = float("-inf")
        expected = z.softmax(-1)
        assert _chi2_pvalue(sampler, logits, expected, 100_000) > 1e-3
        wrong = (logits.masked_fill(torch.arange(V) == M, float("-inf")) / (temperature * 1.5)).softmax(-1)
        if top_k:
            wrong = wrong * (expected > 0)
            wrong = wrong / wrong.sum()
        assert _chi2_pvalue(sampler, logits, wrong, 100_000) < 1e-6
