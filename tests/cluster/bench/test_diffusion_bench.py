"""`specray bench diffusion` runs end to end on a tiny DLLM and a tiny random LLaDA-shaped model,
checks FreeDave's outputs against static decoding's, and writes the table."""

import json

from diffusion_helpers import save_tiny_dllm

from specray.cluster.bench import diffusion as bench
from specray.cluster.cli import main


def test_bench_diffusion_writes_rows_for_every_k(tmp_path, monkeypatch):
    folder = save_tiny_dllm(tmp_path / "m", "dream", scale=6.0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{5 + i} w{9 + i}"}) for i in range(3)))
    monkeypatch.setattr(bench, "LLADA_SCALED", {**bench.LLADA_SCALED, "d_model": 32, "n_heads": 2, "n_kv_heads": 2,
                                                "mlp_hidden_size": 64, "vocab_size": 300, "mask_token_id": 299,
                                                "eos_token_id": 298})
    out = tmp_path / "out"
    assert main(["bench", "diffusion", "--model", str(folder), "--dataset", str(prompts), "--num-prompts", "3",
                 "--max-tokens", "12", "--block-length", "4", "--batch-sizes", "1,2", "--num-drafts", "1,3",
                 "--random-llada", "1", "--random-prompts", "2", "--random-max-tokens", "8",
                 "--out", str(out)]) == 0
    rows = json.loads((out / "diffusion.json").read_text())["rows"]
    assert len(rows) == 2 * 2 * 3  # two models x two batch sizes x (static, K = 3, adaptive up to 4)
    for r in rows:
        assert r["tokens"] > 0 and r["calls_per_token"] > 0 and (r["num_drafts"] > 1 or r["steps_per_call"] <= 1)
    assert "| vs static |" in (out / "diffusion.md").read_text()


def test_bench_diffusion_needs_the_static_baseline(tmp_path):
    assert main(["bench", "diffusion", "--model", "none", "--num-drafts", "2,4", "--out", str(tmp_path)]) == 2
