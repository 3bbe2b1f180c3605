#!/usr/bin/env bash
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
R=docs/results/zen4-2026-11-28/prefill-budget
D=../shared/data/spec_bench/question.jsonl
for pass in 1 2; do
for b in 256 auto; do
  specray serve --port 18650 --grpc-port 18651 --max-prefill-tokens $b --no-enable-prefix-caching > $R/serve.log 2>&1 &
  pid=$!
  for i in $(seq 120); do curl -sf localhost:18650/health >/dev/null && break; sleep 1; done
  specray bench serve --url http://127.0.0.1:18650 --concurrency 16 --num-requests 32 --max-tokens 64 --ignore-eos --temperature 0 --dataset $D --out $R/c16_b${b}_p$pass > $R/c16_${b}_p$pass.log 2>&1
  kill -TERM $pid; wait $pid
done
done
date -u
