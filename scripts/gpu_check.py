"""GPU check (run on a CUDA machine): lossless on CUDA, and CUDA decode speed.

1. Tiny fp32 target + perturbed draft on CUDA: greedy with a draft model equals greedy without,
   and equals the CPU tokens; seeded sampling reproduces.
2. A SmolLM2-135M-shaped model with random weights (no download; speed does not depend on the
   weights): tokens/s of specray target-only vs transformers generate, batch 1 and 8, fp16.
Writes gpu_check.json to $OUT (or the cwd)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import save_tiny_llama, save_word_tokenizer, tiny_llama_config  # noqa: E402

from specray import LLM, SamplingParams  # noqa: E402


def lossless(tmp: Path) -> dict:
    target = save_tiny_llama(tmp / "t", seed=0)
    draft = save_tiny_llama(tmp / "d", seed=1, perturb_from=target, noise=0.35)
    prompts = [{"prompt_token_ids": [1] + [3 + (i * 7 + j * 13) % 90 for j in range(4 + i % 3)] * 2} for i in range(8)]
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    out = {}
    for device in ("cpu", "cuda"):
        plain = LLM(str(target), device=device).generate(prompts, greedy)
        spec = LLM(str(target), device=device, speculative_config={"model": str(draft), "num_speculative_tokens": 3})
        outs = spec.generate(prompts, greedy)
        sampled = [spec.generate(prompts[0], SamplingParams(temperature=1.0, seed=5, max_tokens=16))[0]
                   .outputs[0].token_ids for _ in range(2)]
        out[device] = {"plain": [o.outputs[0].token_ids for o in plain], "spec": [o.outputs[0].token_ids for o in outs],
                       "accepted": sum(o.metrics.num_accepted_tokens for o in outs), "sampled_repeat": sampled[0] == sampled[1]}
    return {"spec_equals_plain_cuda": out["cuda"]["spec"] == out["cuda"]["plain"],
            "cuda_equals_cpu": out["cuda"]["plain"] == out["cpu"]["plain"],
            "accepted_cuda": out["cuda"]["accepted"], "seeded_sampling_reproduces": out["cuda"]["sampled_repeat"]}


def speed(tmp: Path) -> dict:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    cfg = tiny_llama_config(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                            tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp / "smol")
    save_word_tokenizer(tmp / "smol", cfg.vocab_size)
    rows = {}
    for batch in (1, 8):
        prompts = [[1] + list(range(10 + i, 60 + i)) for i in range(batch)]
        llm = LLM(str(tmp / "smol"), device="cuda", dtype="float16", kv_cache_tokens=8192)
        sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=8))
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], sp)
        torch.cuda.synchronize()
        specray_tps = batch * 128 / (time.perf_counter() - t)
        hf = AutoModelForCausalLM.from_pretrained(tmp / "smol", dtype=torch.float16).cuda().eval()
        ids = torch.tensor(prompts, device="cuda")
        hf.generate(ids, max_new_tokens=8, do_sample=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=128, min_new_tokens=128, do_sample=False)
        torch.cuda.synchronize()
        rows[f"batch{batch}"] = {"specray_tok_s": round(specray_tps, 1),
                                 "hf_tok_s": round(batch * 128 / (time.perf_counter() - t), 1)}
    return rows


if __name__ == "__main__":
    assert torch.cuda.is_available(), "needs a CUDA device"
    with tempfile.TemporaryDirectory() as d:
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "lossless": lossless(Path(d)), "speed_fp16_random_smollm2_shape": speed(Path(d))}
    text = json.dumps(report, indent=2)
    print(text)
    (Path(os.environ.get("OUT", ".")) / "gpu_check.json").write_text(text)
