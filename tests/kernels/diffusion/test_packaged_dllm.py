"""The packaged smollm2-135m-dllm: FreeDave equals static decoding token for token on chat prompts,
with strictly fewer model calls over the set, and never more for any prompt."""

import pytest

from specray.kernels.chat import prompt_token_ids
from specray.kernels.diffusion.decoding import CanvasPlan, DecodeOptions, StepSampler
from specray.kernels.diffusion.engine import DiffusionEngine
from specray.kernels.diffusion.weights import load_diffusion_model
from specray.kernels.loader import ModelNotFoundError, resolve
from specray.kernels.sampling import SamplingConfig

QUESTIONS = ["What is the capital of France?", "Give me three tips for staying healthy.",
             "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def packaged():
    try:
        checkpoint = resolve("smollm2-135m-dllm")
    except ModelNotFoundError as e:  # the folder ships in the repository and the wheel
        pytest.fail(str(e))
    model, tok = load_diffusion_model(checkpoint.path), checkpoint.tokenizer()
    return model, tok, [prompt_token_ids(tok, q) for q in QUESTIONS]


def run(model, prompts, options: DecodeOptions, temperature: float = 0.0):
    engine = DiffusionEngine(model, options)
    for i, p in enumerate(prompts):
        sampler = StepSampler(SamplingConfig(temperature), 11 + i, model.config.mask_token_id)
        engine.add(i, p, CanvasPlan.for_request(len(p), 32, options), sampler)
    out = {i: [] for i in range(len(prompts))}
    while any(not s.done for s in engine.seqs.values()):
        for u in engine.step():
            out[u.seq_id] += u.token_ids
    return [out[i] for i in range(len(prompts))], engine.metrics.per_seq_calls


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_freedave_equals_static_with_fewer_calls_on_the_packaged_model(packaged, temperature):
    model, tok, prompts = packaged
    static, static_calls = run(model, prompts, DecodeOptions(32), temperature)
    free, free_calls = run(model, prompts, DecodeOptions(32, num_drafts=4), temperature)
    assert free == static
    assert all(free_calls[i] <= static_calls[i] for i in static_calls)
    assert sum(free_calls.values()) < sum(static_calls.values())
    assert all(tok.decode(ids, skip_special_tokens=True).strip() for ids in static)
