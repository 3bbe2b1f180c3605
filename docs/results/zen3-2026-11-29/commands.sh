#!/usr/bin/env bash
# 2026-11-29, late night, 2-core AMD EPYC Zen 3 (AVX2, no VNNI): the commands behind docs/performance.md
# "2-core AMD EPYC, Zen 3 (AVX2), 2026-11-29: fast16 on a CPU without VNNI".
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=docs/results/zen3-2026-11-29
# cost(k rows) / cost(1 row) in every mode (before and after the rolled part loops: 151d7ab, then HEAD)
python benchmarks/cpu_kernels.py --rows 1,2,3,4,6,8,12,16 --no-torch --repeats 7 --out $R/cpu_kernels.json
python benchmarks/cpu_kernels.py --rows 1,2,3,4,6,8,12,16 --no-torch --repeats 7 --out $R/cpu_kernels_after.json
# the rolled part loops against the unrolled ones (151d7ab), whole forward steps, logits compared
python benchmarks/kernel_ab.py --base 151d7ab --rows 1,2,3,4,8,16 --repeats 7 --kernels fast16 | grep "^rows" > $R/rolled_ab_fast16.txt
python benchmarks/kernel_ab.py --base 151d7ab --rows 1,2,4,8,16 --repeats 7 --kernels fast | grep "^rows" > $R/rolled_ab_fast.txt
# the issue tables: exact, fast16 and fast, plain and the default speculation; llama.cpp's rows
bash scripts/build_llama_cpp.sh >/dev/null
specray bench offline --methods specray,specray_default,specray_fast16,specray_default_fast16,specray_fast,specray_default_fast \
  --num-prompts 26 --max-tokens 128 --batch-sizes 1,16 --temperatures 0 --dataset ../shared/data/spec_bench/question.jsonl \
  --out $R/offline
# served, the default (kernels auto), against the in-process engine and against llama-server
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --repeats 2 \
  --dataset ../shared/data/spec_bench/question.jsonl --out $R/cluster
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos \
  --temperature 0 --llama-parallel 16 --llama-ctx 32768 --dataset ../shared/data/spec_bench/question.jsonl --out $R/vs-llama-server
# the default speculation's settings in fast16, paired against plain decoding
python benchmarks/paired_speedup.py --kernels fast16 --num-prompts 26 --repeats 2 --batch-size 1 --configs \
  '[{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "adaptive": true},
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "adaptive": true},
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3, "adaptive": true},
    {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 2, "adaptive": false},
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "adaptive": true}]' \
  --out $R/paired_fast16_ngram.json
