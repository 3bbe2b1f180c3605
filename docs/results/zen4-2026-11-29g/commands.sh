#!/usr/bin/env bash
# 2026-11-29, evening, 2-core AMD EPYC Zen 4: the commands behind docs/performance.md
# "2026-11-29, evening: fast16, 16-bit activations in two 8-bit parts, and the default".
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=docs/results/zen4-2026-11-29g
DATA=../shared/data/spec_bench/question.jsonl
# quality against the exact mode (teacher-forced on the exact mode's greedy continuations)
python benchmarks/kernel_modes_quality.py --mode fast16 --dataset $DATA --num-prompts 80 --max-tokens 128 \
  > $R/kernel_modes_quality_fast16.txt
# greedy outputs of exact and fast16 against transformers' generate, 80 prompts x 128 tokens
python $R/exact_vs_hf.py 80 > $R/exact_vs_hf.txt
# FAST_ROW_CHUNK 16 against 8 (AVX-512): measured with HEAD at 49087e5 (8) and chunk 16 in the working tree
python benchmarks/kernel_ab.py --base HEAD --rows 1,2,5 --repeats 9 --kernels fast16 --context 200
python benchmarks/kernel_ab.py --base HEAD --rows 1,2,5,8 --repeats 9 --kernels fast --context 200
# the issue tables: every kernel mode, plain and the default speculation, and llama.cpp's rows
bash scripts/build_llama_cpp.sh >/dev/null
specray bench offline --methods specray,specray_default,specray_fast16,specray_default_fast16,specray_fast,specray_default_fast \
  --num-prompts 26 --max-tokens 128 --batch-sizes 1,16 --temperatures 0 --dataset $DATA --out $R/offline
# served, the default (kernels auto: fast16), against llama-server and against the in-process engine
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos \
  --temperature 0 --llama-parallel 16 --llama-ctx 32768 --dataset $DATA --out $R/vs-llama-server
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --repeats 2 \
  --dataset $DATA --out $R/cluster
# a step against the memory floor, each mode
for mode in exact fast16 fast; do
  python benchmarks/decoder_phases.py --kernels $mode --rows 1,2,5 --context 200 --steps 200 --blocks 6 --out $R/phases_$mode.json
done
python $R/sweep_fast16.py   # greedy speculation = plain decoding in fast16, ten configs, batch 6 and 1
python $R/mode_ab.py   # the three modes' steps interleaved in one process
