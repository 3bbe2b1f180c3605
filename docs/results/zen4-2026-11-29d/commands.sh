#!/usr/bin/env bash
# 2026-11-29, 2-core AMD EPYC Zen 4: the commands behind docs/performance.md
# "2026-11-29, late morning: llama.cpp's speculation rows on the chat-templated prompts".
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash scripts/build_llama_cpp.sh >/dev/null  # llama.cpp 11434, with llama-speculative-simple
specray bench offline --methods specray,specray_default,specray_fast,specray_draft_fast \
  --num-prompts 26 --max-tokens 128 --batch-sizes 1 --temperatures 0 \
  --dataset ../shared/data/spec_bench/question.jsonl --out docs/results/zen4-2026-11-29d/offline-b1
# llama-bench again, three times, right after
B=$(ls -d ~/.cache/specray/llama.cpp/*/bin)
G=$(python -c "from specray.kernels.loader import ALIASES, _packaged_file; print(_packaged_file(*ALIASES['smollm2-135m']))")
for i in 1 2 3; do "$B/llama-bench" -m "$G" -p 0 -n 128 -t 2 -r 3 -o json; done
