"""Tier 4 on the real model: SmolLM2-135M greedy output with speculation, in the exact kernel mode,
equals transformers' `generate(do_sample=False)` token for token (8 Spec-Bench prompts, 64 new tokens, batch 8; three of
them at batch 1); in the fast mode it equals that mode's own plain decoding."""

import pytest
import torch

from specray import LLM, SamplingParams
from specray.kernels.loader import resolve

from smollm2_helpers import REFERENCE_TOKENS, needs_smollm2

pytestmark = needs_smollm2
NEW_TOKENS = REFERENCE_TOKENS


@pytest.fixture(scope="module")
def prompt_ids(smollm2_prompt_ids):
    return smollm2_prompt_ids


@pytest.fixture(scope="module")
def hf_model(smollm2_hf):
    return smollm2_hf


@pytest.fixture(scope="module")
def transformers_greedy(smollm2_greedy):
    return smollm2_greedy


def test_prefill_logits_match_transformers(prompt_ids, hf_model):
    from specray.kernels.batch import RaggedBatch, SeqChunk
    from specray.kernels.loader import load_model

    model = load_model(resolve("smollm2-135m"))
    ids = prompt_ids[0]
    cache = model.make_cache(64)
    ours = model(RaggedBatch.build([SeqChunk("p", ids, 0, num_logits=len(ids))], cache), cache)
    with torch.no_grad():
        want = hf_model(torch.tensor([ids])).logits[0]
    # the packed kernels take the prefill too (a row's bits must not depend on its step): fp32 sums in
    # another order than MKL's, within the tolerance tests/kernels/test_model.py holds the model to
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=1e-4)


CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4},
    "truncated_draft": {"method": "draft_model", "model": "smollm2-135m", "draft_num_layers": 4,
                        "num_speculative_tokens": 3},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_speculative_greedy_equals_transformers(name, prompt_ids, transformers_greedy):
    llm = LLM("smollm2-135m", speculative_config=CONFIGS[name], max_num_seqs=8, kernels="exact")
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    batch8 = llm.generate(prompts, sp)
    batch1 = [llm.generate(p, sp)[0] for p in prompts[:3]]  # batch 1 on three of them: the slow half of the test
    tok = llm.get_tokenizer()
    for out, want in zip(batch8, transformers_greedy):
        assert out.outputs[0].token_ids == want
        assert out.outputs[0].text == tok.decode(want, skip_special_tokens=True)  # incremental detokenisation
    for out, want in zip(batch1, transformers_greedy):
        assert out.outputs[0].token_ids == want
    accepted = [o.metrics.num_accepted_tokens for o in batch8]
    drafted = sum(o.metrics.num_draft_tokens for o in batch8)
    assert 0 < sum(accepted) < drafted and len(set(accepted)) > 1, "acceptance must be ragged"


@pytest.mark.parametrize("mode", ["fast", "fast16"])
def test_the_fast_kernels_speculate_losslessly(prompt_ids, mode):
    """The fast kernel modes on the real GGUF (models of their own): greedy speculation at batch 8 and
    batch 1 equals the mode's own plain decoding at batch 8, token for token."""
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    plain_llm = LLM("smollm2-135m", max_num_seqs=8, kernels=mode)
    assert plain_llm.target.model.kernel_mode == mode
    plain = [o.outputs[0].token_ids for o in plain_llm.generate(prompts, sp)]
    llm = LLM("smollm2-135m", speculative_config=CONFIGS["ngram"], max_num_seqs=8, kernels=mode)
    batch8 = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in batch8] == plain
    assert [llm.generate(p, sp)[0].outputs[0].token_ids for p in prompts[:2]] == plain[:2]
    assert sum(o.metrics.num_accepted_tokens for o in batch8) > 0


def test_the_reference_is_greedy_itself(prompt_ids, hf_model, transformers_greedy):
    """transformers' `generate(do_sample=False)` is the reference of every greedy test here; it must
    be argmax decoding under every supported transformers (a major may change generate's defaults),
    so it is checked against an argmax loop over plain forwards, with no cache and no processors."""
    ids = list(prompt_ids[1])
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(hf_model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert ids[len(prompt_ids[1]):] == transformers_greedy[1][:12]


def test_text_cut_inside_a_character_equals_plain_decodings():
    """Emoji take two or more tokens: n-gram rounds that end inside one, the last one too (max_tokens),
    still give plain decoding's text (they lost whole characters before)."""
    prompt = "🙂🙂🙂🙂 😀😀😀😀 🙂🙂🙂🙂 😀😀😀😀 🙂🙂"
    sp = SamplingParams(temperature=0, max_tokens=26)
    plain, spec = (LLM("smollm2-135m", speculative_config=c).generate([prompt], sp)[0].outputs[0]
                   for c in (None, {"method": "ngram", "num_speculative_tokens": 4}))
    assert spec.token_ids == plain.token_ids and spec.text == plain.text and "😀" in plain.text


def test_a_truncated_gguf_is_named_in_its_error(tmp_path, monkeypatch):
    """The reader's own message (a numpy reshape) said nothing of which file failed."""
    from specray.kernels.loader import ALIASES, _packaged_file

    whole = _packaged_file(*ALIASES["smollm2-135m"])
    cut = tmp_path / "cut.gguf"
    with open(whole, "rb") as f:
        cut.write_bytes(f.read(5_000_000))  # the header and part of the first tensor
    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=f"cannot read the GGUF file {cut}.*truncated or corrupt"):
        resolve(str(cut))
    assert not list((tmp_path / "cache" / "converted").glob("cut-*"))  # nothing half-written is kept


def test_llama_cpps_rows_get_the_token_ids_specray_runs():
    """llama.cpp's tools tokenize `-p` as given: the text they get is the chat-templated prompt, so its
    tokens are specray's (they got the bare question before, about half as many tokens)."""
    from specray.cluster.bench.offline import chat_texts
    from specray.kernels.chat import prompt_token_ids

    tok = resolve("smollm2-135m").tokenizer()
    prompts = [{"prompt": "What is 2 + 2?"}, {"prompt": "Write a haiku about the sea.\nThen explain it."}]
    for text, p in zip(chat_texts("smollm2-135m", prompts), prompts):
        assert tok(text, add_special_tokens=False)["input_ids"] == prompt_token_ids(tok, p["prompt"])
