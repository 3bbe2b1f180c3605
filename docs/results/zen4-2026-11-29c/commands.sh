#!/usr/bin/env bash
# 2026-11-29, morning, 2-core AMD EPYC Zen 4: the commands behind docs/performance.md
# "2026-11-29, morning: the default speculation in the default kernel mode; the served tables with more passes".
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=docs/results/zen4-2026-11-29c
DATA=../shared/data/spec_bench/question.jsonl
# speculation / plain at batch 1 with the exact kernels (the default), paired
python benchmarks/paired_speedup.py --kernels exact --num-prompts 26 --max-tokens 128 --repeats 2 --dataset $DATA \
  --configs '[{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 2, "adaptive": true},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4, "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": true},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4, "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": true, "draft_quantization": "q4_1", "draft_vocab_trim": 4096},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 1, "disable_by_batch_size": 2, "draft_quantization": "q4_1", "draft_vocab_trim": 4096}]' \
  --out $R/paired_exact.json
# a step and its extra rows, both kernel modes
python benchmarks/decoder_phases.py --kernels exact --rows 1,2,3 --context 200 --steps 150 --blocks 3 --out $R/phases_exact.json
python benchmarks/decoder_phases.py --kernels fast --rows 1,2,3 --context 200 --steps 150 --blocks 3 --out $R/phases_fast.json
# served / in-process with more passes than before (the defaults)
specray bench cluster --skip-transports --paths served --concurrency 1 --num-requests 16 --max-tokens 64 --repeats 4 \
  --dataset $DATA --out $R/cluster-c1
specray bench cluster --skip-transports --paths served --concurrency 8,16 --num-requests 16 --max-tokens 64 --repeats 3 \
  --dataset $DATA --out $R/cluster-c8-16
# every process's CPU over a level, HTTP and gRPC alternating (a `specray serve` with the defaults running)
specray serve > /tmp/specray-serve.log 2>&1 &
until grep -q "Ctrl-C" /tmp/specray-serve.log; do sleep 2; done
for r in 1 2; do
  python benchmarks/served_trace.py --cpu-only --concurrency 1,8 --num-requests 16 --max-tokens 64 --out $R/served-trace/http$r.json
  python benchmarks/served_trace.py --cpu-only --concurrency 1,8 --num-requests 16 --max-tokens 64 --grpc 127.0.0.1:9000 \
    --out $R/served-trace/grpc$r.json
done
kill -TERM %1
