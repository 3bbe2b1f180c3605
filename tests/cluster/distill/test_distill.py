"""`specray distill` end to end on a tiny target: data, init, KL training, save, held-out evaluation;
the draft loads in transformers and in specray and speculates losslessly (greedy), with and without
VocabTrim; a second run resumes instead of retraining."""

import json

import pytest
import torch

from specray import LLM, SamplingParams
from specray.cluster.cli import main
from specray.cluster.distill.train import kl_topk

from distill_helpers import ARGS


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


def test_distill_longspec_end_to_end(distilled, tiny_target, tmp_path, capsys):
    """--kind longspec on the earlier run's data: target KV cached per shard at anchor-offset
    positions, training raises the held-out agreement, the folder (one layer, no embedding or head)
    serves as method 'longspec' losslessly; a second run reuses the cache and resumes."""
    from safetensors.torch import load_file

    args = ["--kind", "longspec", "--window", "8", "--data", str(distilled / "data"), *ARGS, "--epochs", "30"]
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args]) == 0
    draft = tmp_path / "draft"
    info = json.loads((draft / "longspec.json").read_text())
    assert info["kind"] == "longspec" and info["target"] == str(tiny_target) and info["window"] == 8
    assert info["held_out_after"]["agreement_lag1"] > info["held_out_before"]["agreement_lag1"]
    assert info["eval"]["lossless"] and info["eval"]["runs"]
    keys = set(load_file(str(draft / "model.safetensors")))
    assert "cross_q_proj" in keys and not any("embed" in k or "head" in k for k in keys)
    cached = sorted((tmp_path / "longspec_kv").glob("*.pt"))
    assert cached
    stamp = [f.stat().st_mtime_ns for f in cached]
    capsys.readouterr()
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *args, "--eval-k", "0"]) == 0
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "longspec_kv").glob("*.pt"))] == stamp
    assert "resumed from" in capsys.readouterr().err


def test_distill_defaults_fit_the_engines_logprobs_limit(tiny_target, tmp_path, capsys):
    """The default teacher top-k is one the engine returns; more is refused before any work."""
    from specray.cluster.distill.cli import add_distill_parser
    from specray.cluster.params import MAX_LOGPROBS

    import argparse

    parser = argparse.ArgumentParser()
    add_distill_parser(parser.add_subparsers())
    assert parser.parse_args(["distill", "--out", "x"]).teacher_top_k <= MAX_LOGPROBS
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), "--teacher-top-k", "32"]) != 0
    assert "--teacher-top-k must be in [1, 20]" in capsys.readouterr().err


def test_distill_longspec_refuses_a_bad_window(tiny_target, tmp_path, capsys):
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), "--kind", "longspec",
                 "--window", "513"]) != 0
    assert "--window must be in [1, 512]" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, want", [
    ("--epochs", "0", "--epochs: expected a number > 0"), ("--num-layers", "0", "--num-layers: expected an integer >= 1"),
    ("--vocab-trim-k", "-5", "--vocab-trim-k: expected an integer >= 0"), ("--lr", "-1", "--lr: expected a number > 0"),
    ("--lr", "nan", "--lr: expected a number > 0"), ("--batch-size", "0", "--batch-size: expected an integer >= 1"),
    ("--max-len", "0", "--max-len: expected an integer >= 1"), ("--eval-k", "-1", "--eval-k: expected an integer >= 0"),
    ("--checkpoint-every", "0", "--checkpoint-every: expected an integer >= 1"),
    ("--temperature", "inf", "--temperature: expected a number >= 0"),
])
def test_distill_refuses_bad_numbers_before_any_work(tiny_target, tmp_path, capsys, flag, value, want):
    """Before the slow data phase, not when training or saving reads them."""
    with pytest.raises(SystemExit) as e:
        main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), flag, value])
    assert e.value.code == 2 and want in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_distill_refuses_a_file_as_its_run_folder(tiny_target, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "f")])
    assert e.value.code == 2 and "expected a folder for the outputs" in capsys.readouterr().err


def test_init_from_another_vocabulary_is_a_clear_error(tiny_target, tmp_path):
    from specray.cluster.distill.phases import load_draft
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


def test_data_only_writes_shards_and_no_draft(distilled, tiny_target, tmp_path):
    """--data-only: the shards another run trains on with --extra-data; no draft, no checkpoint."""
    assert main(["distill", "--model", str(tiny_target), "--out", str(tmp_path), *ARGS, "--data-only"]) == 0
    shards = sorted((tmp_path / "data").iterdir())
    assert shards and not (tmp_path / "draft").exists() and not (tmp_path / "checkpoint.pt").exists()
    assert [p.name for p in shards] == sorted(p.name for p in (distilled / "data").iterdir())


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
