"""GPU check for tree speculation (run on a CUDA machine): with every tree method and ADED, greedy
output on CUDA equals plain greedy on CUDA, and seeded sampling reproduces. Prints one JSON object
and writes it to $OUT/gpu_tree_check.json (or the cwd)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import save_tiny_llama  # noqa: E402

from specray import LLM, SamplingParams  # noqa: E402

TREES = {"rsd_c": {"kind": "rsd_c", "branching": [2, 2, 1]}, "rsd_s": {"kind": "rsd_s", "width": 2},
         "spectr": {"kind": "spectr", "k": 2}, "topk": {"kind": "topk", "k": 2, "width": 2}}


def main() -> dict:
    tmp = Path(tempfile.mkdtemp())
    target = save_tiny_llama(tmp / "t", seed=0)
    draft = save_tiny_llama(tmp / "d", seed=1, perturb_from=target, noise=0.35)
    prompts = [{"prompt_token_ids": [1] + [3 + (i * 7 + j * 13) % 90 for j in range(4 + i % 3)] * 2} for i in range(6)]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, seed=5, max_tokens=16, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(target), device="cuda").generate(prompts, greedy)]
    configs = {name: {"model": str(draft), "num_speculative_tokens": 3, "tree": tree} for name, tree in TREES.items()}
    configs["aded"] = {"method": "aded", "num_speculative_tokens": 3}
    out = {}
    for name, cfg in configs.items():
        llm = LLM(str(target), device="cuda", speculative_config=cfg)
        outs = llm.generate(prompts, greedy)
        runs = [llm.generate(prompts[0], sampled)[0].outputs[0].token_ids for _ in range(2)]
        rounds = sum(o.metrics.num_rounds for o in outs)
        out[name] = {"greedy_equals_plain": [o.outputs[0].token_ids for o in outs] == plain,
                     "tau": sum(o.metrics.num_emitted_tokens for o in outs) / max(rounds, 1),
                     "sampled_repeat": runs[0] == runs[1]}
    return out


if __name__ == "__main__":
    result = main()
    text = json.dumps(result, indent=1)
    print(text)
    (Path(os.environ.get("OUT", ".")) / "gpu_tree_check.json").write_text(text)
