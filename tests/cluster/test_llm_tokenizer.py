"""The offline API's tokenizer options (as vLLM's): a folder without tokenizer files is a clear
error naming it; `tokenizer=` borrows one; `skip_tokenizer_init=True` runs on token ids alone; and
a folder's generation_config.json names end-of-sequence tokens too."""

import shutil

import pytest

from specray import LLM, SamplingParams
from specray.kernels.loader import TOKENIZER_FILES

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def bare(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bare") / "model"
    shutil.copytree(tiny_target, folder)
    for name in (*TOKENIZER_FILES, "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    return folder


def test_a_folder_without_a_tokenizer_is_a_clear_error(bare):
    with pytest.raises(ValueError, match=f"{bare} holds no tokenizer.*skip_tokenizer_init"):
        LLM(str(bare))


def test_borrowed_and_skipped_tokenizers_give_the_same_tokens(bare, tiny_target):
    want = LLM(str(tiny_target)).generate("w5 w9 w14", GREEDY)[0].outputs[0]
    borrowed = LLM(str(bare), tokenizer=str(tiny_target)).generate("w5 w9 w14", GREEDY)[0].outputs[0]
    assert borrowed.token_ids == want.token_ids and borrowed.text == want.text
    ids_only = LLM(str(bare), skip_tokenizer_init=True)
    prompt = {"prompt_token_ids": LLM(str(tiny_target)).get_tokenizer()("w5 w9 w14").input_ids}
    out = ids_only.generate(prompt, GREEDY)[0].outputs[0]
    assert out.token_ids == want.token_ids and out.text == ""
    with pytest.raises(ValueError, match="no tokenizer"):
        ids_only.generate("w5 w9", GREEDY)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        ids_only.generate(prompt, SamplingParams(max_tokens=4, stop=["w5"]))


def test_generation_configs_eos_ids_stop_too(tiny_target, tmp_path):
    """An instruct model's end of turn is often only in generation_config.json (Llama 3's <|eot_id|>):
    vLLM stops there, and so does specray (ignore_eos aside)."""
    import json
    import shutil

    prompt, params = {"prompt_token_ids": [1, 8, 9]}, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    free_run = LLM(str(tiny_target)).generate(prompt, params)[0].outputs[0]
    folder = shutil.copytree(tiny_target, tmp_path / "with_generation_config")
    eos = json.loads((folder / "config.json").read_text()).get("eos_token_id")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, free_run.token_ids[3]]}))
    llm = LLM(str(folder))
    out = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0))[0].outputs[0]
    first = free_run.token_ids.index(free_run.token_ids[3]) + 1
    assert out.token_ids == free_run.token_ids[:first] and out.finish_reason == "stop" and first < 12
    ignored = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0].outputs[0]
    assert ignored.token_ids == free_run.token_ids
