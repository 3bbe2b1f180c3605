#!/usr/bin/env bash
# The issue tables on this box, one after another (nothing else running).
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
R=docs/results/zen4-2026-11-28
D=../shared/data/spec_bench/question.jsonl
date -u
python benchmarks/decoder_phases.py --kernels fast --rows 1,2,4 --context 200 --steps 200 --blocks 4 --out $R/phases_fast.json
date -u
specray bench offline --methods specray,specray_default,specray_fast,specray_default_fast --num-prompts 26 --max-tokens 128 --batch-sizes 1,16 --temperatures 0 --dataset $D --out $R/offline
date -u
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --repeats 2 --dataset $D --out $R/cluster
date -u
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos --temperature 0 --llama-parallel 16 --llama-ctx 32768 --dataset $D --out $R/vs-llama-server
date -u
