"""`specray distill --self-prompts`: prompts the target writes itself, alone or beside a seed file."""

import json

import pytest

from specray import LLM
from specray.cluster.cli import main
from specray.kernels.chat import prompt_token_ids

from distill_helpers import ARGS


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
        with pytest.raises(SystemExit) as e:  # refused when parsed, before the target loads
            main(["distill", "--model", str(tiny_target), "--out", str(tmp_path / "run"), *ARGS, *flags])
        assert e.value.code == 2 and f"argument {flags[-2]}: expected an integer >= 1" in capsys.readouterr().err
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
    assert asked <= {tuple(prompt_token_ids(tok, p))
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
    kept = len(_written(out / "self_prompts.jsonl"))  # the tiny model closes some of its 24 draws' turns
    assert kept >= 2 and info["num_train_prompts"] + info["num_eval_prompts"] == 6 + kept
    assert info["num_eval_prompts"] == 2
    from specray.cluster.distill.data import load_samples

    tok = LLM(str(tiny_target)).get_tokenizer()
    answered = {tuple(s.prompt_ids) for s in load_samples(sorted((out / "data").glob("shard-*.pt")))}
    every = [json.loads(line)["prompt"] for line in seeds.read_text().splitlines()] + _written(out / "self_prompts.jsonl")
    ids = {p: tuple(prompt_token_ids(tok, p)) for p in every}
    assert len(answered) == 6 + kept - 2 and answered < set(ids.values())
    held_out = set(ids.values()) - answered
    assert len(held_out) == 2 and any(ids[p] in answered for p in every[:6]) and any(ids[p] in answered for p in every[6:])
