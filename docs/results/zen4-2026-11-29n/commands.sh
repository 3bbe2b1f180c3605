#!/usr/bin/env bash
# 2026-11-29, night, 2-core AMD EPYC Zen 4: the commands behind docs/performance.md
# "2026-11-29, night: each weight tile read once for a step's row chunks; what a row costs on AVX2".
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=docs/results/zen4-2026-11-29n
# the tile loop against the kernels before it (2f0fc8a), both builds, both fast modes
for m in fast16 fast; do
  python benchmarks/kernel_ab.py --base 2f0fc8a --rows 1,2,3,4,6,8,12,16 --repeats 7 --kernels $m --context 200 \
    | grep "^rows" > $R/tile_rows_ab_avx512_$m.txt
  SPECRAY_CPU_KERNEL_FLAGS=-mno-avx512f python benchmarks/kernel_ab.py --base 2f0fc8a --rows 1,2,3,4,6,8,12,16 \
    --repeats 7 --kernels $m --context 200 | grep "^rows" > $R/tile_rows_ab_avx2_$m.txt
done
python benchmarks/kernel_ab.py --base 2f0fc8a --rows 64,256 --repeats 5 --kernels fast16 --context 200
# cost(k rows) / cost(1 row) in every mode, both builds
python benchmarks/cpu_kernels.py --rows 1,2,3,4,6,8,12,16 --no-torch --repeats 7 --out $R/cpu_kernels_avx512.json
SPECRAY_CPU_KERNEL_FLAGS=-mno-avx512f python benchmarks/cpu_kernels.py --rows 1,2,3,4,6,8,12,16 --no-torch \
  --repeats 7 --out $R/cpu_kernels_avx2_build.json
SPECRAY_CPU_KERNEL_FLAGS=-mno-avx512f python docs/results/zen4-2026-11-29g/mode_ab.py
# where a batch-1 token goes in the engine (fast16, plain)
python $R/engine_prof.py plain 600 > $R/engine_prof_plain.txt
# the replica's CPU per thread at c = 1: save, load, diff (pids of the replica, the worker host, the driver)
#   specray serve &   # then:
#   python $R/thread_cpu.py save $REPLICA $WORKER; specray bench serve --url http://127.0.0.1:8000 \
#     --concurrency 1 --num-requests 24 --max-tokens 64 --ignore-eos --temperature 0; python $R/thread_cpu.py diff $REPLICA $WORKER
# the issue tables on this HEAD (exact and fast16, plain and the default speculation; llama.cpp's rows)
bash scripts/build_llama_cpp.sh >/dev/null
specray bench offline --methods specray,specray_default,specray_fast16,specray_default_fast16 --num-prompts 26 \
  --max-tokens 128 --batch-sizes 1,16 --temperatures 0 --dataset ../shared/data/spec_bench/question.jsonl --out $R/offline
# served, the default (kernels auto: fast16), against the in-process engine and against llama-server
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
