"""A diffusion LM through the offline API and the CLI: detected from its folder, outputs equal to
static decoding (FreeDave or not, any batch), EOS/stops/max_tokens, n and seeds, and clear errors."""

import pytest
import torch
from diffusion_helpers import MASK, save_tiny_dllm

from specray import LLM, SamplingParams
from specray.cluster.params import SamplingParamError
from specray.cluster.cli import main as cli_main
from specray.kernels.diffusion.decoding import CanvasPlan, DecodeOptions, StepSampler, static_decode
from specray.kernels.sampling import SamplingConfig

PROMPTS = [[5, 6, 7], [9], [11, 12, 13, 14, 15, 16, 17, 18], [20, 21]]


@pytest.fixture(scope="module", params=["llada", "dream"])
def folder(request, tmp_path_factory):
    return save_tiny_dllm(tmp_path_factory.mktemp(request.param), request.param, scale=6.0)


def _reference(llm: LLM, prompt: list[int], max_tokens: int, block: int, sampling=SamplingConfig(0.0), seed=0,
               steps: int | None = None, ignore_eos: bool = False):
    """Static decoding of the whole canvas, then the API's rules: cut after EOS, then at max_tokens."""
    model = llm.target.model
    plan = CanvasPlan.for_request(len(prompt), max_tokens, DecodeOptions(block, steps))
    canvas, _ = static_decode(model, prompt, plan, StepSampler(sampling, seed, MASK))
    out = canvas[len(prompt):].tolist()
    eos = None if ignore_eos else next((i for i, t in enumerate(out) if t == 2), None)
    return out[:eos + 1] if eos is not None and eos < max_tokens else out[:max_tokens]


@pytest.mark.parametrize("num_drafts", [1, 4])
def test_generate_equals_static_decoding_at_every_batch_size(folder, num_drafts):
    llm = LLM(str(folder), speculative_config={"method": "freedave", "num_drafts": num_drafts},
              diffusion_config={"block_length": 8}, max_num_seqs=3)
    params = SamplingParams(temperature=0.0, max_tokens=19)  # 19: not a multiple of the block
    expected = [_reference(llm, p, 19, 8) for p in PROMPTS]
    for batch in (1, 2, 4):
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:batch]], params)
        assert [o.outputs[0].token_ids for o in outs] == expected[:batch]
        for o in outs:
            c = o.outputs[0]
            assert c.finish_reason == ("stop" if c.token_ids[-1] == 2 else "length") and len(c.token_ids) <= 19
            m = o.metrics
            assert m.num_diffusion_steps >= m.num_rounds - 1 and m.num_emitted_tokens == len(c.token_ids)


def test_sampled_requests_repeat_with_a_seed_and_choices_differ(folder):
    llm = LLM(str(folder), speculative_config={"method": "freedave", "num_drafts": 3},
              diffusion_config={"block_length": 4, "steps_per_block": 2})
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=12, n=2, ignore_eos=True)
    a = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)[0]
    b = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert a.outputs[0].token_ids != a.outputs[1].token_ids
    static = LLM(str(folder), diffusion_config={"block_length": 4, "steps_per_block": 2})
    c = static.generate([{"prompt_token_ids": PROMPTS[0]}], params)[0]
    assert [x.token_ids for x in c.outputs] == [x.token_ids for x in a.outputs]
    for choice in (0, 1):  # choice i draws with seed + i
        ref = _reference(llm, PROMPTS[0], 12, 4, SamplingConfig(0.9, top_p=0.95), seed=7 + choice, steps=2,
                         ignore_eos=True)
        assert a.outputs[choice].token_ids == ref


def test_the_engine_seed_makes_unseeded_requests_repeat(folder):
    """LLM(seed=...) seeds unseeded requests' draws, as it does for an autoregressive model."""
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    runs = [[o.outputs[0].token_ids for o in LLM(str(folder), seed=seed, diffusion_config={"block_length": 8})
             .generate([{"prompt_token_ids": p} for p in PROMPTS], params)] for seed in (5, 5, 6)]
    assert runs[0] == runs[1] != runs[2]


def test_stop_tokens_strings_and_chat(folder):
    llm = LLM(str(folder), diffusion_config={"block_length": 8})
    free = llm.generate([{"prompt_token_ids": PROMPTS[2]}], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    tokens = free[0].outputs[0].token_ids
    stop_at = tokens[5]
    cut = llm.generate([{"prompt_token_ids": PROMPTS[2]}], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                                          stop_token_ids=[stop_at]))
    c = cut[0].outputs[0]
    assert c.token_ids == tokens[:tokens.index(stop_at) + 1] and c.finish_reason == "stop"
    word = free[0].outputs[0].text.split()[3]
    stopped = llm.generate([{"prompt_token_ids": PROMPTS[2]}], SamplingParams(temperature=0, max_tokens=16,
                                                                              ignore_eos=True, stop=[word]))[0]
    text = stopped.outputs[0]
    assert word not in text.text and text.finish_reason == "stop" and text.stop_reason == word
    # a block's tokens past the one that completes the stop string are not the answer's (nor its usage)
    tok = llm.get_tokenizer()
    assert word in tok.decode(text.token_ids) and word not in tok.decode(text.token_ids[:-1])
    assert stopped.metrics.num_emitted_tokens == len(text.token_ids) < 16  # the block was cut: its tail is not emitted
    assert cut[0].metrics.num_emitted_tokens == len(c.token_ids)
    chat = llm.chat([{"role": "user", "content": "w7 w8"}], SamplingParams(temperature=0, max_tokens=8))
    assert chat[0].outputs[0].token_ids


def test_a_stream_yields_only_when_a_request_has_new_tokens_or_ends(folder):
    """Every model call yielded every request, also when no block of it was finalised."""
    llm = LLM(str(folder), diffusion_config={"block_length": 8, "steps_per_block": 8})
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = list(llm.stream([{"prompt_token_ids": PROMPTS[0]}], params))
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    assert lengths == sorted(set(lengths)) and outs[-1].finished and lengths[-1] == 16
    assert len(outs) < outs[-1].metrics.num_rounds  # 16 one-token steps in fewer outputs


@pytest.mark.parametrize("kwargs, message", [
    (dict(speculative_config={"method": "freedave", "model": "some-draft"}), "no draft model"),
    (dict(speculative_config={"method": "draft_model"}), "freedave"),
    (dict(speculative_config={"num_speculative_tokens": 3}), "do not apply"),
    (dict(speculative_config={"method": "freedave", "num_drafts": 0}), "num_drafts"),
    (dict(diffusion_config={"block_length": 8, "steps_per_block": 9}), "steps_per_block"),
    (dict(diffusion_config={"blocks": 8}), "unknown diffusion_config"),
    # engine options a diffusion LM has no use for were ignored in silence
    (dict(pipelined=True), "pipelined apply to autoregressive models"),
    (dict(kv_cache_tokens=4096, max_prefill_tokens=64), "kv_cache_tokens, max_prefill_tokens apply"),
    # a block the context cannot hold beside a prompt: every request was refused, after the weights loaded
    (dict(max_model_len=16, diffusion_config={"block_length": 16}), "no room for a prompt"),
])
def test_bad_diffusion_configs_are_clear_errors(folder, kwargs, message, monkeypatch):
    import specray.cluster.llm as llm_module

    monkeypatch.setattr(llm_module, "load_diffusion_model", lambda *a, **k: pytest.fail("the weights must not load"))
    with pytest.raises(ValueError, match=message):
        LLM(str(folder), **kwargs)


def test_bad_requests_are_clear_errors_and_harm_nothing(folder):
    llm = LLM(str(folder), diffusion_config={"block_length": 8})
    for params, message in [(SamplingParams(logprobs=2), "logprobs"),
                            (SamplingParams(num_speculative_tokens=2), "do not apply"),
                            (SamplingParams(stop_token_ids=[500]), "stop_token_ids"),
                            (SamplingParams(logit_bias={5: 1.0}), "logit_bias: not implemented for a diffusion LM"),
                            (SamplingParams(min_p=0.1), "min_p: not implemented for a diffusion LM")]:
        with pytest.raises(ValueError, match=message):
            llm.generate([{"prompt_token_ids": PROMPTS[0]}, {"prompt_token_ids": PROMPTS[1]}], params)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([{"prompt_token_ids": []}], SamplingParams())
    with pytest.raises(ValueError, match="leaves no room for a block of 8"):
        llm.generate([{"prompt_token_ids": [5] * 505}], SamplingParams())  # 7 slots left: no whole block
    with pytest.raises(SamplingParamError) as refused:  # the field an OpenAI error body names
        llm.router.config.check_request([5] * 505, SamplingParams())
    assert refused.value.param == "prompt"
    assert not llm.router.has_unfinished()
    ok = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(temperature=0, max_tokens=8))
    assert ok[0].outputs[0].token_ids == _reference(llm, PROMPTS[0], 8, 8)


def test_a_canvas_past_the_context_is_cut_to_whole_blocks_as_a_sequence_stops_there(folder):
    """As an autoregressive sequence stops at the context: max_tokens 600 beside 490 prompt tokens of
    a 512-token model leaves two blocks of 8; it was refused (the served default of 256 with it)."""
    llm = LLM(str(folder), diffusion_config={"block_length": 8})
    prompt = [5, 6, 7] * 163 + [9]  # 490 tokens
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=600,
                                                                     ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and out.token_ids == _reference(llm, prompt, 16, 8, ignore_eos=True)


def test_autoregressive_model_refuses_diffusion_options(tiny_target):
    with pytest.raises(ValueError, match="autoregressive"):
        LLM(str(tiny_target), diffusion_config={"block_length": 8})
    assert cli_main(["generate", "--model", str(tiny_target), "--num-drafts", "2", "w5"]) == 2


def test_cli_generate_streams_a_diffusion_model(folder, capsys):
    assert cli_main(["generate", "--model", str(folder), "--no-chat-template", "--max-tokens", "16",
                     "--block-length", "8", "--num-drafts", "3", "w5 w6"]) == 0
    captured = capsys.readouterr()
    assert "model calls a token" in captured.err and captured.out.strip()
    for flags in (["--draft-model", "x"], ["--prompt-lookup-min", "3"], ["--prompt-lookup-max", "7"]):
        assert cli_main(["generate", "--model", str(folder), *flags, "w5"]) == 2  # the lookup ones were ignored
        assert f"a diffusion LM takes none of {flags[0]}" in capsys.readouterr().err
    # FreeDave's whole config, as `specray serve` takes it; checked where the model loads
    spec = '{"method": "freedave", "num_drafts": 2}'
    assert cli_main(["generate", "--model", str(folder), "--max-tokens", "8", "--speculative-config", spec, "w5"]) == 0
    capsys.readouterr()
    for flags, words in ((["--speculative-config", '{"num_drafts": 0}'], "num_drafts"),
                         (["--speculative-config", spec, "--num-drafts", "3"], "whole speculative_config"),
                         (["--num-drafts", "0"], "--num-drafts must be")):
        assert cli_main(["generate", "--model", str(folder), *flags, "w5"]) == 2
        assert words in capsys.readouterr().err
    torch.manual_seed(0)


def test_model_calls_count_forwards_only(folder):
    """The round that only hands a finished canvas back ran no forward: it counted as a model call
    (a request alone showed one more call than it took part in)."""
    llm = LLM(str(folder), diffusion_config={"block_length": 8})
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert llm.router.stats.model_calls == out.metrics.num_rounds > 0


def test_the_served_counters_sum_the_requests_speculation(folder):
    """specray_spec_decode_* stayed 0 for FreeDave while every request's usage counted drafts."""
    llm = LLM(str(folder), speculative_config={"method": "freedave", "num_drafts": 3},
              diffusion_config={"block_length": 8})
    outs = llm.generate([{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}],
                        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    stats = llm.router.stats
    assert stats.num_draft_tokens == sum(o.metrics.num_draft_tokens for o in outs) > 0
    assert stats.num_accepted_tokens == sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0 < stats.num_drafts <= stats.model_calls * 2
