"""The scripts in benchmarks/ run on the tiny models and measure what they claim to."""

import importlib.util
from pathlib import Path


def _script(name: str):
    """benchmarks/<name>.py as a module."""
    path = Path(__file__).parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tree_benchmark_configs_are_valid_and_comparable():
    """benchmarks/trees.py: every config passes the router's validation; the budget group verifies
    at most its budget per round and its chain has exactly that length."""

    from specray.cluster.config.speculative import SpeculativeConfig

    trees = _script("trees")
    configs = trees.configs("some-draft", depth=3, budget=6)
    parsed = {name: SpeculativeConfig.from_dict(c) for name, c in configs.items()}
    assert parsed["none"] is None
    assert {n.split("/")[1] for n in configs if "/" in n} == {"chain", "rsd_c", "rsd_s", "spectr", "topk", "aded"}
    assert all(parsed[n].max_draft_tokens() <= 6 for n in configs if n.startswith("budget/"))
    assert parsed["budget/chain"].num_speculative_tokens == 6 and parsed["depth/chain"].num_speculative_tokens == 3
    rows = [{"method": m, "temperature": 1.0, "tokens_per_s": s, "acceptance_length": 1.5, "verified_per_round": 2}
            for m, s in (("none", 10.0), ("depth/chain", 20.0), ("depth/rsd_c", 25.0))]
    table = trees.markdown({"rows": rows})
    assert "| depth/rsd_c | 1.0 | 25.00 | 1.25x | 2.50x |" in table and "| none | 1.0 | 10.00 | - | 1.00x |" in table


def test_paired_speedup_benchmark_runs_and_counts(tiny_target, tmp_path):
    """benchmarks/paired_speedup.py: every config runs every group, outputs equal plain decoding's,
    and the token count is prompts x tokens x repeats; a bad --configs is refused."""
    import json

    import pytest

    paired = _script("paired_speedup")
    out = tmp_path / "p.json"
    result = paired.main(["--model", str(tiny_target), "--num-prompts", "4", "--batch-size", "2", "--max-tokens", "4",
                          "--repeats", "2", "--configs", json.dumps([{"method": "ngram", "num_speculative_tokens": 2}]),
                          "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["groups"] == 2 and result["tokens_per_config"] == 4 * 4 * 2
    plain, ngram = result["rows"]
    assert plain["config"] == "plain" and plain["pooled_speedup"] == 1.0 and plain["acceptance_length"] == 1.0
    assert plain["decode_speedup"] == 1.0 and ngram["decode_speedup"] > 0
    assert ngram["lossless"] and ngram["acceptance_length"] >= 1.0 and ngram["tokens_per_s"] > 0
    # round-robin over categories: groups of 2 mix two categories; one prompt a group names its own
    assert list(result["by_category"]) == ["mixed"]
    assert result["by_category"]["mixed"][ngram["config"]]["acceptance_length"] == ngram["acceptance_length"]
    with pytest.raises(SystemExit, match="--configs"):
        paired.main(["--model", str(tiny_target), "--configs", "{}"])


def test_paired_speedup_splits_by_category():
    """A category's speed-up pools only its own runs' decode seconds and tokens."""
    paired = _script("paired_speedup")
    decode = {"plain": [2.0, 4.0, 2.0, 4.0], "c": [1.0, 4.0, 1.0, 4.0]}
    emitted = {"plain": [(4, 4)] * 4, "c": [(4, 2), (4, 4), (4, 2), (4, 4)]}
    got = paired.per_category(["plain", "c"], ["qa", "rag", "qa", "rag"], decode, emitted)
    assert got == {"qa": {"c": {"decode_speedup": 2.0, "acceptance_length": 2.0}},
                   "rag": {"c": {"decode_speedup": 1.0, "acceptance_length": 1.0}}}
    assert paired.category_of(["qa", "qa"]) == "qa" and paired.category_of(["qa", "rag"]) == "mixed"


def test_round_breakdown_splits_rounds_and_bounds_them(tiny_target, tmp_path):
    """benchmarks/round_breakdown.py: a round's parts add up to it, speculation's rounds emit more
    than one token each, and only the speculative rows carry the bound."""
    import json

    rounds = _script("round_breakdown")
    out = tmp_path / "r.json"
    result = rounds.main(["--model", str(tiny_target), "--num-prompts", "2", "--max-tokens", "12", "--repeats", "1",
                          "--kernels", "exact", "--out", str(out),
                          "--configs", json.dumps([{"method": "ngram", "num_speculative_tokens": 3}])])
    assert json.loads(out.read_text()) == result
    plain, ngram = result["rows"]
    assert plain["acceptance_length"] == 1.0 and plain["draft_ms"] == 0.0 and "bound" not in plain
    assert ngram["acceptance_length"] >= 1.0 and ngram["bound"] > 0
    for row in (plain, ngram):
        assert abs(row["target_ms"] + row["draft_ms"] + row["other_ms"] - row["round_ms"]) < 1e-2
        assert row["target_ms"] > 0 and row["decode_tokens_per_s"] > 0


def test_distill_draft_benchmark_measures_chains_lookup_and_trees(tiny_target, tiny_draft, tmp_path):
    """benchmarks/distill_draft.py: chain, lookup-first and tree rows (alone and behind lookup) all
    equal plain decoding, and a tree row verifies more draft tokens a round than its depth."""
    import json

    bench = _script("distill_draft")
    out = tmp_path / "d.json"
    result = bench.main(["--model", str(tiny_target), "--draft", str(tiny_draft), "--num-prompts", "2",
                         "--max-tokens", "6", "--ks", "2", "--trim-off-ks", "", "--skip-hf", "--lookup-first",
                         "--tree", json.dumps({"kind": "topk", "k": 2, "width": 2}), "--tree-ks", "2,3",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = {(r["method"], r.get("k")): r for r in result["runs"]}
    assert set(rows) == {("specray (no speculation)", None), ("specray + draft", 2),
                         ("specray + draft, lookup first", 2), ("specray + draft, tree", 2),
                         ("specray + draft, tree", 3), ("specray + draft, lookup first, tree", 2),
                         ("specray + draft, lookup first, tree", 3)}
    assert all(r["lossless"] for r in result["runs"] if "lossless" in r)
    assert rows[("specray + draft", 2)]["drafted_per_round"] <= 2
    assert 3 < rows[("specray + draft, tree", 3)]["drafted_per_round"] <= 2 + 2 * 2 * 2  # top-2 of 2 nodes a level
    assert all(r["tokens"] == 2 * 6 for r in result["runs"])
    sampled = bench.main(["--model", str(tiny_target), "--draft", str(tiny_draft), "--num-prompts", "2",
                          "--max-tokens", "6", "--ks", "2", "--trim-off-ks", "", "--temperature", "1",
                          "--tree", json.dumps({"kind": "rsd_c", "branching": [2, 1]}), "--tree-ks", "2",
                          "--out", str(out)])
    assert [r["method"] for r in sampled["runs"]] == ["specray (no speculation)", "specray + draft",
                                                      "specray + draft, tree"]
    assert all(r["lossless"] is None and r["tokens"] == 12 for r in sampled["runs"][1:])


def test_kv_cache_dtype_benchmark_steps_both_caches(tiny_gguf_target, tmp_path):
    """benchmarks/kv_cache_dtype.py: every case times the fp32 and the fp16 cache and compares their
    logits; a malformed case is refused."""
    import json

    import pytest

    from specray.kernels import cpu_ops

    if not cpu_ops.available():
        pytest.skip("the fast mode needs the C kernels")
    bench = _script("kv_cache_dtype")
    out = tmp_path / "kv.json"
    results = bench.main(["--model", str(tiny_gguf_target), "--cases", "1x9x1,2x5x3", "--repeats", "1",
                          "--steps", "1", "--out", str(out)])
    assert json.loads(out.read_text())["results"] == results
    assert [(r["seqs"], r["context"], r["rows"]) for r in results] == [(1, 9, 1), (2, 5, 3)]
    assert all(r["ms_fp32"] > 0 and r["ms_fp16"] > 0 and 0 <= r["top1_agreement"] <= 1 for r in results)
    with pytest.raises(AssertionError, match="SEQSxCONTEXTxROWS"):
        bench.parse_cases("1x200")


def test_lookup_sources_replays_greedy_acceptance_exactly(tiny_target, tmp_path):
    """benchmarks/lookup_sources.py: a replay accepts what greedy verification would, the index of
    earlier answers proposes its latest match, and a run on the tiny model reports every source."""
    import json

    sources = _script("lookup_sources")
    # round 1: 4 has no earlier occurrence; round 2: 1 matched, [2 3 4 1] proposed, 3 accepted
    record = {"prompt": [7, 1, 2, 3, 4], "answer": [1, 2, 3, 4, 8]}
    assert sources.replay([record], (1, 4), lambda m: m[0][:4]) == {"tau": 2.5, "rows_per_round": 2.0}
    # matches of 2+: rounds 1 and 2 find none; round 3 matches [1 2], proposes [3 4 1 2], accepts 2
    assert sources.replay([record], (2, 4), lambda m: m[0][:4]) == {"tau": 5 / 3, "rows_per_round": 4 / 3}
    # at most the match's length: [1] matched proposes [2] (accepted); [1 2 3] matched proposes [4 1 2]
    assert sources.replay([record], (1, 4), lambda m: m[0][:m[1]]) == {"tau": 5 / 3, "rows_per_round": 4 / 3}
    index = sources.AnswerIndex(2, 3)
    index.add([5, 6, 7, 8])
    assert index.propose([0, 5, 6], 2) == [7, 8] and index.propose([0, 6], 2) == []
    index.add([5, 6, 9])
    assert index.propose([0, 5, 6], 2) == [9]  # the latest answer's
    out, cache = tmp_path / "s.json", tmp_path / "answers.json"
    exact = ["--model", str(tiny_target), "--kernels", "exact"]  # a tiny HF model: no GGUF blocks to run fast
    result = sources.main([*exact, "--num-prompts", "3", "--max-tokens", "12", "--answers", str(cache),
                           "--out", str(out)])
    assert json.loads(out.read_text()) == result and result["prompts"] == 3
    assert set(result["sources"]) == set(sources.SOURCES)
    assert all(r["tau"] >= 1.0 and r["speedup_bound"] > 0 for r in result["sources"].values())
    again = sources.main([*exact, "--answers", str(cache), "--out", str(out)])
    assert again["sources"] == result["sources"]  # read back from the cache, not generated anew


def test_prefix_caching_benchmark_times_both_engines_and_counts_hits(tiny_target, tmp_path):
    """benchmarks/prefix_caching.py: the engine with prefix caching finds the follow-up turns' and the
    shared passage's blocks, the one without finds none, and both decode."""
    import json

    # first turns of 20 words: the first block is the question's (the tiny chat template's assistant
    # header differs from its generation prompt, so the answer's blocks never match)
    rows = [{"category": "writing", "turns": [" ".join(f"w{10 + i + j}" for j in range(20)), f"w{20 + i} w21"]}
            for i in range(3)]
    rows += [{"category": "rag", "turns": [" ".join(f"w{30 + i % 50}" for i in range(80))]}]
    rows += [{"category": "qa", "turns": [f"w{60 + i} w61"]} for i in range(3)]
    dataset = tmp_path / "q.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = _script("prefix_caching").main(["--dataset", str(dataset), "--model", str(tiny_target),
                                              "--num-prompts", "3", "--max-tokens", "20"])
    assert summary["off"]["turn2_hit"] == summary["off"]["shared_hit"] == 0
    assert 0 < summary["on"]["turn2_hit"] < 1 and summary["on"]["shared_hit"] > 0.5
    assert summary["on"]["decode_tokens_per_s"] > 0 and summary["off"]["decode_tokens_per_s"] > 0
