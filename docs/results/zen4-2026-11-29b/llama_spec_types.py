"""llama.cpp's n-gram speculation types (`llama-speculative-simple --spec-type T`, 4 draft tokens,
greedy, 128 tokens) on the first Spec-Bench prompt of each of the 13 categories, chat template applied;
decode tokens/s over all of them. A probe behind docs/performance.md "2026-11-29, early morning".
Usage: python docs/results/zen4-2026-11-29b/llama_spec_types.py TYPE ..."""

import json
import sys
from pathlib import Path

from specray.cluster.bench.llama_cpp import find_llama_binary, speculation_cell
from specray.cluster.bench.side_by_side import gguf_of
from specray.kernels.loader import resolve

BINARY, TARGET = find_llama_binary("llama-speculative-simple", None), gguf_of("smollm2-135m")
DATASET = Path(__file__).resolve().parents[4] / "shared" / "data" / "spec_bench" / "question.jsonl"


def prompts() -> list[str]:
    firsts = {}
    for line in DATASET.read_text().splitlines():
        row = json.loads(line)
        firsts.setdefault(row["category"], row["turns"][0])
    tok = resolve("smollm2-135m").tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in firsts.values()]


def tokens_per_s(spec_type: str, texts: list[str]) -> float:
    cell = speculation_cell(spec_type, [str(BINARY), "-m", str(TARGET), "-n", "128", "-t", "2", "--temp", "0", "-c",
                                        "4096", "--spec-type", spec_type, "--spec-draft-n-max", "4"], texts)
    return round(cell.tokens / cell.seconds, 1)


if __name__ == "__main__":
    texts = prompts()
    for spec_type in sys.argv[1:]:
        print(spec_type, tokens_per_s(spec_type, texts), flush=True)
