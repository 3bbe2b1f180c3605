"""`specray bench offline` runs end to end on a tiny model and writes consistent JSON/Markdown/PNG."""

import json

import pytest

from specray.cluster.bench.methods import TREE_METHODS
from specray.cluster.bench.report import SCHEMA
from specray.cluster.cli import main

from eagle_helpers import save_tiny_eagle


def test_bench_offline_end_to_end(tiny_target, tmp_path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"category": c, "turns": [f"w{10 + i} w{20 + i} w{10 + i} w{20 + i}"]}
            for i, c in enumerate(["writing", "math", "writing", "coding", "math"])]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    eagle = save_tiny_eagle(tmp_path / "eagle", tiny_target)
    code = main(["bench", "offline", "--model", str(tiny_target), "--dataset", str(data), "--num-prompts", "4",
                 "--max-tokens", "5", "--batch-sizes", "1,2", "--temperatures", "0,1", "--draft-num-layers", "1",
                 "--layer-parallel", "1",
                 "--eagle-model", str(eagle), "--out", str(out)])
    assert code == 0
    report = json.loads((out / "offline.json").read_text())
    assert report["schema"] == SCHEMA and (out / "offline.md").read_text().startswith("model ")
    assert (out / "offline.png").read_bytes()[:4] == b"\x89PNG"
    cells = {(c["method"], c["batch_size"], c["temperature"]): c for c in report["cells"]}
    # transformers' 3, specray's 8 (its default included), 5 tree methods, a top-k tree, plain and the
    # default in fast16 (what `specray serve` runs a GGUF in)
    assert len(cells) == 19 * 2 * 2
    assert cells[("hf_assisted", 2, 0.0)]["skipped"] and cells[("specray_draft_padded", 1, 0.0)]["skipped"]
    for m in ("specray_fast16", "specray_default_fast16"):  # the tiny target's weights are no GGUF blocks
        assert all("no GGUF Q4_1/Q8_0 weights" in cells[(m, b, t)]["skipped"] for b in (1, 2) for t in (0.0, 1.0))
    for c in report["cells"]:
        if not c["skipped"]:
            assert c["requests"] == 4 and c["tokens"] == 4 * 5  # every request generated max_tokens
            assert abs(c["tokens_per_s"] - c["tokens"] / c["seconds"]) < 0.01 * c["tokens_per_s"] + 0.01
        if not c["skipped"] and c["method"].startswith("specray"):  # the metrics count the outputs' tokens
            assert c["emitted"] == c["tokens"] - c["requests"] and c["accepted"] <= c["drafted"]  # prefill: 1st
            assert c["rounds"] <= c["emitted"] <= c["rounds"] + c["accepted"]  # a round: accepted + 1, cut at max_tokens
            assert abs(c["acceptance_length"] - c["emitted"] / c["rounds"]) < 1e-3
            if c["drafted"]:
                assert abs(c["acceptance_rate"] - c["accepted"] / c["drafted"]) < 1e-3
            assert c["drafted"] > 0 or c["accepted"] == 0
            # a step reads the weights once for the group's sequences, each emitting its acceptance length
            sequences = min(c["batch_size"], 4)
            assert abs(c["bound_tokens_per_s"] * bw_step(report) - sequences * c["acceptance_length"]) < 0.01
    assert all(cells[("specray", b, t)]["drafted"] == 0 for b in (1, 2) for t in (0.0, 1.0))
    for m in ("specray", "specray_default", "specray_ngram", "specray_draft", "specray_easyspec", "specray_eagle",
              *TREE_METHODS, "specray_draft_topk"):
        assert cells[(m, 1, 0.0)]["greedy_matches_hf"] is True
    for m in TREE_METHODS:  # they ran as trees (several draft tokens a round), at every batch size
        assert all(cells[(m, b, t)]["drafted"] > 0 for b in (1, 2) for t in (0.0, 1.0))
    assert cells[("specray_draft", 2, 0.0)]["acceptance_length"] >= 1.0
    assert set(cells[("specray", 1, 0.0)]["per_category"]) == {"writing", "math", "coding"}
    assert report["summary"]["specray_plain_vs_hf_plain_batch1"] is not None
    assert report["summary"]["default_speculation_vs_plain_batch1"] is not None
    assert report["partial"] is False and report["config"]["sequences_per_batch"] == {"1": 1, "2": 2}
    bw = report["bandwidth"]  # the bound reads every weight byte at the faster of the two readings
    assert bw["gb_per_s"] == max(bw["gemv_gb_per_s"], bw["stream_gb_per_s"]) > 0
    assert abs(bw["seconds_per_step"] * bw["gb_per_s"] * 1e9 - bw["weight_bytes"]) < 0.01 * bw["weight_bytes"]
    plain = cells[("specray", 1, 0.0)]
    assert abs(plain["bound_tokens_per_s"] * bw["seconds_per_step"] - 1.0) < 0.01  # acceptance 1: one step a token
    assert abs(plain["fraction_of_bound"] - plain["tokens_per_s"] / plain["bound_tokens_per_s"]) < 0.01
    # the roofline: no faster than memory nor than the projections' arithmetic (weights in cache)
    assert bw["hot_gemv_seconds_per_step"] > 0 and bw["limited_by"] in ("memory", "compute")
    assert bw["roofline_seconds_per_step"] == max(bw["seconds_per_step"], bw["hot_gemv_seconds_per_step"])
    assert plain["fraction_of_roofline"] >= plain["fraction_of_bound"] - 1e-3
    assert cells[("specray", 2, 0.0)]["fraction_of_roofline"] is None  # batch 1 only


def bw_step(report) -> float:
    return report["bandwidth"]["seconds_per_step"]


def test_kv_sizing_covers_each_group_and_the_padded_baseline():
    """Each engine holds its largest group at once; an engine that also runs the padded baseline
    holds every sequence padded to its group's longest (the full run once ran out of blocks there)."""
    from specray.cluster.bench.offline import kv_tokens_needed

    encoded = [[0] * n for n in (40, 769, 53, 660)]
    extra = 10 + 4 * 2 + 32  # new tokens, a tree of depth 2, block rounding
    assert kv_tokens_needed(encoded, [1, 2], 10, 2) == 40 + 769 + 2 * extra  # the first pair
    assert kv_tokens_needed(encoded, [1, 4], 10, 2) == sum(map(len, encoded)) + 4 * extra
    assert kv_tokens_needed(encoded, [1, 4], 10, 2, padded=True) == 4 * (769 + extra)


def test_stream_bandwidth_reads_the_whole_buffer():
    """The plain read is a real reading; the bound takes the faster of the two."""
    from specray.cluster.bench.bound import Bandwidth, stream_bytes_per_s

    assert stream_bytes_per_s(16 << 20, repeats=2) > 1e8  # > 0.1 GB/s on any machine
    bw = Bandwidth(weight_bytes=10**6, gemv_bytes_per_s=2e9, stream_bytes_per_s=4e9)
    assert bw.step_s == bw.roofline_step_s == 10**6 / 4e9 and bw.limited_by == "memory"  # no arithmetic floor
    slow = Bandwidth(weight_bytes=10**6, gemv_bytes_per_s=2e9, stream_bytes_per_s=4e9, hot_gemv_s=1e-3)
    assert slow.roofline_step_s == 1e-3 and slow.limited_by == "compute"


def test_hot_gemv_scales_the_slices_to_the_whole_step(tiny_target):
    """The arithmetic floor runs on fp32 weights (F.linear) and on packed blocks (the C kernel, which
    gets raw pointers: the slices must outlive the timing loop)."""
    from specray.cluster.bench.bound import hot_gemv_seconds
    from specray.kernels.loader import load_model, resolve

    model = load_model(resolve(str(tiny_target)))
    assert hot_gemv_seconds(model, repeats=2, inner=3) > 0
    model.enable_cpu_kernels()
    if model.round_weights("q8_0"):  # a C compiler: the packed kernel's floor
        assert model.packed_weights and hot_gemv_seconds(model, repeats=2, inner=3) > 0


def test_bench_offline_runs_the_served_mode_on_gguf_weights(tiny_gguf_target, tmp_path):
    """On GGUF Q4_1/Q8_0 weights the fast16 rows run (in fast16), and the summary's default / plain
    takes their pair: what `specray serve` would give."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"category": "math", "turns": [f"w{i} w{i + 3} w{i} w{i + 3}"]})
                              for i in range(2)))
    out = tmp_path / "out"
    code = main(["bench", "offline", "--model", str(tiny_gguf_target), "--dataset", str(data), "--num-prompts", "2",
                 "--max-tokens", "4", "--batch-sizes", "1", "--temperatures", "0",
                 "--methods", "specray,specray_fast16,specray_default_fast16", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "offline.json").read_text())
    cells = {c["method"]: c for c in report["cells"]}
    assert not any(c["skipped"] for c in cells.values()) and cells["specray_fast16"]["tokens"] == 2 * 4
    assert report["summary"]["default_speculation_vs_plain_batch1"] == pytest.approx(
        cells["specray_default_fast16"]["decode_tokens_per_s"] / cells["specray_fast16"]["decode_tokens_per_s"],
        rel=0.01)


def test_bench_offline_writes_each_finished_row(tiny_target, tmp_path, monkeypatch, capsys):
    """A run stopped part-way keeps the rows it finished (JSON + Markdown, marked partial)."""
    from specray.cluster.bench import offline as bench_offline

    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"category": "math", "turns": [f"w{i} w{i + 3}"]}) for i in range(2)))
    out = tmp_path / "out"
    real, calls, caching = bench_offline.Runner.run, [], []

    def stop_in_second_row(self, method, group, temperature, seed, cell):
        calls.append(temperature)
        caching.extend(llm.target.cache.prefix_caching for llm in self.llms.values())
        if temperature == 1.0:
            raise KeyboardInterrupt
        return real(self, method, group, temperature, seed, cell)

    monkeypatch.setattr(bench_offline.Runner, "run", stop_in_second_row)
    code = main(["bench", "offline", "--model", str(tiny_target), "--dataset", str(data), "--num-prompts", "2",
                 "--max-tokens", "3", "--batch-sizes", "1,4", "--temperatures", "0,1", "--methods", "hf,specray",
                 "--out", str(out)])
    assert code == 130  # Ctrl-C
    assert "batch size 4 > 2 prompts" in capsys.readouterr().err  # said, not silent
    report = json.loads((out / "offline.json").read_text())
    assert report["config"]["sequences_per_batch"] == {"1": 1, "4": 2}
    assert report["partial"] is True and not (out / "offline.png").exists()
    assert {(c["method"], c["temperature"]) for c in report["cells"]} == {("hf", 0.0), ("specray", 0.0)}
    assert all(c["tokens"] == 2 * 3 for c in report["cells"])
    assert caching and not any(caching)  # every cell computes its prompts, as the other engines' rows do


def test_bench_cluster_closed_loop_and_table(tiny_target, tiny_draft):
    """The pieces of `specray bench cluster` that the served/transport tests (test_serve_app,
    test_ray_pools) do not run: the in-process closed loop and the report table."""
    from specray import LLM, SamplingParams
    from specray.cluster.bench.cluster import measured_loop
    from specray.cluster.bench.cluster_report import markdown

    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 2},
              max_num_seqs=2)
    requests = [[1, 5 + i, 9, 12] * 2 for i in range(5)]
    row = measured_loop(llm.router, requests, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), 2)
    assert row["completed"] == 5 and row["output_tokens"] == 30 and not llm.router.has_unfinished()
    m = row["round_ms"]  # in this process the worker computes for (nearly) all of the wait
    assert m["rounds"] > 0 and m["target_wait"] > 0 and m["draft_wait"] > 0 and m["router"] > 0
    assert 0.5 * m["target_wait"] < m["target_compute"] <= m["target_wait"]
    assert m["draft_compute"] == m["draft_wait"]  # an in-process draft pool reports no compute of its own
    assert abs(m["wall"] - m["target_wait"] - m["draft_wait"] - m["router"]) < 0.01
    served = {**row, "throughput_tokens_per_s": row["throughput_tokens_per_s"] / 2}
    table = markdown({"model": "tiny", "speculative_config": {}, "max_tokens": 6, "num_requests": 5,
                      "in_process": [row], "served_pipelined": [served],
                      "transports": [{"transport": "ray", "bytes_sent_per_round": 1, "bytes_received_per_round": 2,
                                      "round_trip_ms": 3, "throughput_tokens_per_s": 4}]})
    assert "| served_pipelined | 2 |" in table and "0.50x" in table and "| ray | 1 | 2 | 3 | 4 |" in table
    assert f"| in_process | 2 | {m['rounds']} | {m['wall']} |" in table


def test_bench_cluster_reports_each_paths_median_pass():
    from specray.cluster.bench.cluster_report import LABELS, median_rows

    def pass_(*speeds):  # one throughput per concurrency level, same for every path
        return {label: [{"concurrency": c, "throughput_tokens_per_s": v} for c, v in zip((1, 8), speeds)]
                for label in LABELS}

    merged = median_rows([pass_(3, 30), pass_(1, 90), pass_(2, 60)])
    assert [r["throughput_tokens_per_s"] for r in merged["served_pools"]] == [2, 60]
    assert [r["concurrency"] for r in merged["in_process"]] == [1, 8]
    assert [r["throughput_tokens_per_s"] for r in median_rows([pass_(1, 9), pass_(2, 8)])["in_process"]] == [1, 8]
    slow = pass_(3, 30)
    slow["served_pools"][1]["throughput_tokens_per_s"] = 15  # half of its pass's in-process
    paired = median_rows([slow, pass_(1, 90), pass_(2, 60)])["served_pools"]
    assert [r["vs_in_process"] for r in paired] == [1.0, 1.0]  # the median pair, not median / median
    drifted = [pass_(3, 30), pass_(1, 90), pass_(2, 60)]
    for p in drifted:  # the in-process run just before each level: twice as fast as the level
        for row in p["served_pools"]:
            row["in_process_paired"] = 2 * row["throughput_tokens_per_s"]
    merged = median_rows(drifted)
    assert [r["vs_paired"] for r in merged["served_pools"]] == [0.5, 0.5]
    assert [r["vs_in_process"] for r in merged["served_pools"]] == [1.0, 1.0]  # the pass's start: unchanged
    assert "vs_paired" not in merged["in_process"][0]


def test_bench_cluster_paths_pick_what_runs_and_name_the_choices():
    import argparse

    from specray.cluster.bench.cluster import PATHS, paths_list
    from specray.cluster.cli import build_parser

    assert paths_list("served, served_pools") == ("served", "served_pools")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown path.*served_pool.*choose from ray_pools, served"):
        paths_list("served,served_pool")
    with pytest.raises(argparse.ArgumentTypeError, match="none given"):
        paths_list(" , ")
    assert build_parser().parse_args(["bench", "cluster"]).paths == PATHS
    assert build_parser().parse_args(["bench", "cluster", "--paths", "ray_pools"]).paths == ("ray_pools",)


def test_bench_easyspec_end_to_end(tmp_path, tiny_target):
    """`specray bench easyspec` on a 6-layer model truncated to 5 and 6 layers: every fitting N runs,
    the greedy output never changes with N, N = 1 has no fuzzy steps."""
    from helpers import save_tiny_llama

    deep = save_tiny_llama(tmp_path / "deep", seed=0, num_hidden_layers=6)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"category": "c", "turns": [f"w{10 + i} w{20 + i} w{10 + i}"]})
                              for i in range(2)))
    out = tmp_path / "out"
    assert main(["bench", "easyspec", "--model", str(deep), "--drafts", f"{deep}@5,{deep}", "--sizes", "1,2,3,4",
                 "--dataset", str(data), "--num-prompts", "2", "--max-tokens", "12", "--out", str(out)]) == 0
    report = json.loads((out / "easyspec.json").read_text())
    got = {(r["draft"].endswith("@5"), r["N"]) for r in report["rows"] if r["calibrated"]}
    assert got == {(True, 1), (True, 2), (True, 3), (False, 1), (False, 2), (False, 3), (False, 4)}
    assert {(r["draft"].endswith("@5"), r["N"]) for r in report["rows"] if not r["calibrated"]} == {(True, 3), (False, 4)}
    for r in report["rows"]:
        assert r["greedy_matches_n1"] is True and r["acceptance_length"] >= 1
        assert (r["fuzzy_ms_per_step"] is None) == (r["N"] == 1)
    n4 = next(r for r in report["rows"] if r["N"] == 4 and r["calibrated"])
    assert n4["attention_steps_per_draft_token"] == (6 + 2 * 3) / 3  # first token exact, then 3 groups
    assert (out / "easyspec.png").read_bytes()[:4] == b"\x89PNG" and "| N |" in (out / "easyspec.md").read_text()
    # sizes that fit no draft: an error naming them (it exited 0 with an empty report)
    assert main(["bench", "easyspec", "--model", str(deep), "--drafts", str(deep), "--sizes", "9",
                 "--dataset", str(data), "--num-prompts", "1", "--max-tokens", "4", "--out", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("argv, words", [
    (["serve", "--concurrency", "0"], "expected an integer >= 1, got '0'"),
    (["serve", "--concurrency", "-2"], "expected an integer >= 1"),
    (["serve", "--num-requests", "0"], "--num-requests"), (["serve", "--request-rate", "-1"], "a number > 0"),
    (["serve", "--request-rate", "nan"], "a number > 0"), (["serve", "--temperature", "inf"], "a number >= 0"),
    (["serve", "--max-tokens", "-5"], "--max-tokens"), (["serve", "--temperature", "-1"], "--temperature"),
    (["offline", "--num-prompts", "0"], "--num-prompts"), (["offline", "--max-tokens", "0"], "--max-tokens"),
    (["offline", "--temperatures", "-1"], "--temperatures"), (["offline", "--batch-sizes", "0"], "--batch-sizes"),
    (["diffusion", "--num-prompts", "0"], "--num-prompts"), (["diffusion", "--batch-sizes", "0"], "--batch-sizes"),
    (["cluster", "--concurrency", "0"], "--concurrency"),
    (["offline", "--methods", ""], "--methods: expected comma-separated names"),  # not "all methods"
    (["offline", "--methods", ","], "--methods: expected comma-separated names"),  # not "llama.cpp alone"
    (["offline", "--eagle-k", "0"], "--eagle-k"), (["offline", "--draft-num-layers", "0"], "--draft-num-layers"),
    (["easyspec", "--group-workers", "-1"], "--group-workers"), (["diffusion", "--adaptive", "0"], "--adaptive"),
    *[([kind, "--out", __file__], "expected a folder for the outputs") for kind in
      ("offline", "serve", "cluster", "easyspec", "diffusion")],  # refused before the run, not after it
])
def test_bench_refuses_bad_arguments_before_anything_runs(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("flags, want", [([], False), (["--enable-prefix-caching"], True),
                                         (["--no-enable-prefix-caching"], False)])
def test_bench_cluster_measures_without_prefix_caching_unless_asked(flags, want):
    """Every level sends the same prompts: a cache would answer them from the second level on, so
    every path (the in-process engines too) runs without one unless the flag asks for it."""
    from specray.cluster.bench.cluster import bench_config
    from specray.cluster.cli import build_parser
    from specray.cluster.serve.cli import resolve_config

    args = build_parser().parse_args(["bench", "cluster", *flags])
    cfg = bench_config(resolve_config(args), args.enable_prefix_caching)
    assert cfg.router.enable_prefix_caching is want and cfg.http.host == "127.0.0.1"
