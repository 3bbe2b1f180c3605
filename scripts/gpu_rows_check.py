"""GPU check of what a verification row costs (run on a CUDA machine): cost(k rows) / cost(1 row)
of one sequence's forward step, k = 1..16, at 200 cached tokens, on a model with SmolLM2-135M's
shape (random weights: the cost does not depend on them), fp16 and fp32. On a CPU the same ratio is
benchmarks/cpu_kernels.py's. Prints JSON and writes $OUT/gpu_rows_check.json (or the cwd)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import save_word_tokenizer, tiny_llama_config  # noqa: E402

from specray.kernels.batch import RaggedBatch, SeqChunk  # noqa: E402
from specray.kernels.loader import Checkpoint, load_model  # noqa: E402

ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
CONTEXT = 200


def step_ms(model, rows: int, repeats: int = 30) -> float:
    cache = model.make_cache(64, block_size=16)
    device = model.embed_tokens.device
    model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + CONTEXT)), 0)], cache, device), cache)
    times = []
    for i in range(repeats + 5):
        cache.set_cached("s", CONTEXT)
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(RaggedBatch.build([SeqChunk("s", [7] * rows, CONTEXT, num_logits=rows)], cache, device), cache)
        torch.cuda.synchronize()
        if i >= 5:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> dict:
    from transformers import LlamaForCausalLM

    cfg = tiny_llama_config(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                            tie_word_embeddings=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "context": CONTEXT}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(Path(tmp) / "smol")
        save_word_tokenizer(Path(tmp) / "smol", cfg.vocab_size)
        for dtype in (torch.float16, torch.float32):
            model = load_model(Checkpoint(Path(tmp) / "smol", "smol"), dtype=dtype, device="cuda")
            ms = {k: step_ms(model, k) for k in ROWS}
            out[str(dtype).split(".")[1]] = {"step_ms": {k: round(v, 3) for k, v in ms.items()},
                                             "cost_k_over_1": {k: round(v / ms[1], 3) for k, v in ms.items()}}
    return out


if __name__ == "__main__":
    assert torch.cuda.is_available(), "needs a CUDA device"
    text = json.dumps(main(), indent=1)
    print(text)
    (Path(os.environ.get("OUT", ".")) / "gpu_rows_check.json").write_text(text)
