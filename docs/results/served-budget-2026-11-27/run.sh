#!/bin/bash
# served runs at several max_prefill_tokens budgets, alternating; Spec-Bench's natural prompt mix
cd /tmp/s/budget
for pass in 1 2; do for b in 512 256 128; do
  pkill -f "specray serve"; ray stop --force >/dev/null 2>&1; sleep 2
  specray serve --max-prefill-tokens $b > serve_$b.log 2>&1 &
  for i in $(seq 1 60); do sleep 3; curl -s localhost:8000/v1/models >/dev/null 2>&1 && break; done
  echo "== pass $pass budget $b $(date -u +%H:%M:%S)"
  specray bench serve --concurrency 8 --num-requests 48 --max-tokens 64 --ignore-eos --temperature 0 \
     --dataset /work/shared/data/spec_bench/question.jsonl --out out_${b}_$pass 2>&1 | grep -v "it/s\]" | tail -3
done; done
pkill -f "specray serve"; ray stop --force >/dev/null 2>&1
