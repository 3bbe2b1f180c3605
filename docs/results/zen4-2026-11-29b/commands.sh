#!/usr/bin/env bash
# 2026-11-29, 2-core AMD EPYC Zen 4: the commands behind docs/performance.md
# "2026-11-29, early morning: llama.cpp's draft-model speculation in the side by side".
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash scripts/build_llama_cpp.sh >/dev/null  # llama.cpp 11434, with llama-speculative-simple
specray bench offline --methods specray,specray_default,specray_fast,specray_default_fast,specray_draft_fast \
  --num-prompts 26 --max-tokens 128 --batch-sizes 1 --temperatures 0 \
  --dataset ../shared/data/spec_bench/question.jsonl --out docs/results/zen4-2026-11-29b/offline-b1
specray bench serve --against-llama-server --concurrency 1 --num-requests 16 --max-tokens 64 --ignore-eos \
  --temperature 0 --llama-parallel 16 --llama-ctx 32768 --llama-args "--spec-type ngram-map-k --spec-draft-n-max 4" \
  --dataset ../shared/data/spec_bench/question.jsonl --out docs/results/zen4-2026-11-29b/vs-llama-server-ngram
python docs/results/zen4-2026-11-29b/llama_spec_types.py ngram-simple ngram-map-k ngram-mod ngram-cache
# the served tables with the defaults (exact kernels, adaptive n-gram), for the issues' closing notes
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 \
  --repeats 2 --dataset ../shared/data/spec_bench/question.jsonl --out docs/results/zen4-2026-11-29b/cluster
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos \
  --temperature 0 --llama-parallel 16 --llama-ctx 32768 --dataset ../shared/data/spec_bench/question.jsonl \
  --out docs/results/zen4-2026-11-29b/vs-llama-server
