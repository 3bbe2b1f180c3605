#!/usr/bin/env bash
# Served A/B of prefill budgets, alternating: run.sh NAME "BUDGETS" CONCURRENCY REQUESTS PASSES
# The runs recorded here:
#   run.sh ab "256 128 64" 8 24 3         (fixed budgets; ab_*)
#   run.sh adaptive "256 auto" 1,8 24 3   (auto against the old default; adaptive_*)
#   run.sh c16 "256 auto" 16 32 2         (c16_*)
set -u
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
NAME=$1 BUDGETS=$2 CONC=$3 REQS=$4 PASSES=$5
R=docs/results/zen4-2026-11-28/prefill-budget
D=../shared/data/spec_bench/question.jsonl
for pass in $(seq "$PASSES"); do
  for b in $BUDGETS; do
    specray serve --port 18650 --grpc-port 18651 --max-prefill-tokens "$b" --no-enable-prefix-caching > $R/serve.log 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf localhost:18650/health >/dev/null && break; sleep 1; done
    specray bench serve --url http://127.0.0.1:18650 --concurrency "$CONC" --num-requests "$REQS" --max-tokens 64 \
      --ignore-eos --temperature 0 --dataset $D --out "$R/${NAME}_b${b}_p$pass" > "$R/${NAME}_${b}_p$pass.log" 2>&1
    kill -TERM $pid; wait $pid
  done
done
