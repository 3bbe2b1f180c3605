#!/usr/bin/env bash
# 2026-11-29, afternoon, 2-core AMD EPYC Zen 4: the commands behind docs/performance.md
# "2026-11-29, afternoon: the fast kernels a lane a feature".
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=docs/results/zen4-2026-11-29f
DATA=../shared/data/spec_bench/question.jsonl
FILES="kernels/csrc/fast_linear.c kernels/csrc/fast_linear_avx2.h kernels/csrc/fast_linear_avx512.h kernels/fast_linear.py"
# a step by its rows, before (3ff5632) and after (9205316) alternating; AVX-512, then the AVX2 path
for isa in "" _avx2; do
  flags=""; [ "$isa" = _avx2 ] && flags="-mno-avx512f"
  for round in 1 2; do
    for rev in 3ff5632 9205316; do
      git checkout -q $rev -- $FILES
      name=$([ $rev = 3ff5632 ] && echo before || echo after)
      SPECRAY_CPU_KERNEL_FLAGS="$flags" python benchmarks/decoder_phases.py --kernels fast --rows 1,2,3,4,8 \
        --context 200 --steps 200 --blocks 3 --out $R/phases/phases${isa}_${name}_$round.json
    done
  done
done
git checkout -q 9205316 -- $FILES
python benchmarks/decoder_phases.py --kernels fast --rows 1,2 --context 200 --steps 200 --blocks 6 --out $R/phases/floor_after.json
python benchmarks/decoder_phases.py --kernels exact --rows 1,2 --context 200 --steps 200 --blocks 6 --out $R/phases/floor_exact.json
# speculation in the fast mode, paired (run once with the files at 9205316, once at 3ff5632)
CONFIGS='[{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 2, "adaptive": true},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4, "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": true, "draft_quantization": "q4_1", "draft_vocab_trim": 4096},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 1, "disable_by_batch_size": 2, "draft_quantization": "q4_1", "draft_vocab_trim": 4096},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 2, "disable_by_batch_size": 2, "draft_quantization": "q4_1", "draft_vocab_trim": 4096}]'
python benchmarks/paired_speedup.py --kernels fast --num-prompts 26 --max-tokens 128 --repeats 2 --dataset $DATA \
  --configs "$CONFIGS" --out $R/paired_fast_after.json
git checkout -q 3ff5632 -- $FILES
python benchmarks/paired_speedup.py --kernels fast --num-prompts 26 --max-tokens 128 --repeats 2 --dataset $DATA \
  --configs "$CONFIGS" --out $R/paired_fast_before.json
git checkout -q 9205316 -- $FILES
# the issue tables (llama.cpp rows from its cached build)
bash scripts/build_llama_cpp.sh >/dev/null
specray bench offline --methods specray,specray_default,specray_fast,specray_default_fast --num-prompts 26 \
  --max-tokens 128 --batch-sizes 1,16 --temperatures 0 --dataset $DATA --out $R/offline
# served / in-process and against llama-server, the fast kernels
specray bench cluster --skip-transports --paths served --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --repeats 2 \
  --kernels fast --dataset $DATA --out $R/cluster-fast
specray bench serve --against-llama-server --concurrency 1,8,16 --num-requests 16 --max-tokens 64 --ignore-eos \
  --temperature 0 --llama-parallel 16 --llama-ctx 32768 --specray-args "--kernels fast" --dataset $DATA --out $R/vs-llama-server-fast
# AVX2 builds' masks (53824ed), old (its parent) and new alternating, both kernel modes
for round in 1 2; do
  for rev in 9205316 53824ed; do
    git checkout -q $rev -- kernels/csrc/vec16.h kernels/csrc/decoder.c kernels/csrc/attention_scores.h
    v=$([ $rev = 9205316 ] && echo old || echo new)
    for mode in fast exact; do
      SPECRAY_CPU_KERNEL_FLAGS="-mno-avx512f" python benchmarks/decoder_phases.py --kernels $mode --rows 1,2,4,8 \
        --context 200 --steps 150 --blocks 2 --out $R/avx2-masks/${mode}_${v}_$round.json
    done
  done
done
git checkout -q HEAD -- kernels/csrc
# trees with the cheaper rows (fast mode), paired
python benchmarks/paired_speedup.py --kernels fast --num-prompts 26 --max-tokens 128 --repeats 2 --dataset $DATA \
  --configs '[{"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4, "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": true, "draft_quantization": "q4_1", "draft_vocab_trim": 4096},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 2, "tree": {"kind": "topk", "k": 2, "width": 2}, "verify_budget": 4, "disable_by_batch_size": 2, "draft_quantization": "q4_1", "draft_vocab_trim": 4096},
 {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 3, "tree": {"kind": "topk", "k": 2, "width": 2}, "verify_budget": 6, "lookup_first": true, "disable_by_batch_size": 2, "draft_quantization": "q4_1", "draft_vocab_trim": 4096}]' \
  --out $R/paired_fast_trees.json
# cost(k rows) / cost(1 row), k = 1..16, before and after, each ISA
for isa in avx512 avx2; do
  F=""; [ $isa = avx2 ] && F="-mno-avx512f"
  for rev in 3ff5632 9205316; do
    git checkout -q $rev -- $FILES
    lab=$([ $rev = 9205316 ] && echo after || echo before)
    SPECRAY_CPU_KERNEL_FLAGS="$F" python $R/row-costs/costs16.py fast ${isa}_$lab | tail -1 > $R/row-costs/${isa}_$lab.json
  done
done
git checkout -q HEAD -- $FILES
# the n-gram default's knobs with the cheaper rows (fast mode), paired
python benchmarks/paired_speedup.py --kernels fast --num-prompts 26 --max-tokens 128 --repeats 2 --dataset $DATA \
  --configs '[{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 2, "adaptive": true},
 {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "disable_by_batch_size": 2, "adaptive": true},
 {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "disable_by_batch_size": 2, "adaptive": true}]' \
  --out $R/paired_fast_ngram.json
