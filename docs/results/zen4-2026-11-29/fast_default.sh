#!/usr/bin/env bash
# The served figures with the fast kernels, before choosing them as the default (nothing else running).
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
R=docs/results/zen4-2026-11-29
D=../shared/data/spec_bench/question.jsonl
date -u
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --repeats 2 --kernels fast --dataset $D --out $R/cluster-fast
date -u
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos --temperature 0 --llama-parallel 16 --llama-ctx 32768 --specray-args "--kernels fast" --dataset $D --out $R/vs-llama-server-fast
date -u
# the exact mode's served figures in the same hour, for the choice of the default
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --repeats 2 --kernels exact --dataset $D --out $R/cluster-exact
date -u
# the default (exact) against llama-server, after the default was kept
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos --temperature 0 --llama-parallel 16 --llama-ctx 32768 --dataset $D --out $R/vs-llama-server-exact
date -u
