"""Time to the first token of long prompts, in-process (exact kernels): the C attention's old split
rule (a prefill chunk of any size split past 2048 context keys) against the new (16 rows at most),
alternating. Run from the repository root: python docs/results/long-prefill-2026-11-27/long_ttft.py 2048,4096 2"""
import sys, time
from specray import LLM, SamplingParams
from specray.kernels.hybrid_attention import hybrid_settings
llm = LLM("smollm2-135m", max_model_len=8192)
sp = SamplingParams(temperature=0.0, max_tokens=1)
text = open("README.md").read() + open("docs/serving.md").read() * 4
for n in [int(x) for x in sys.argv[1].split(",")]:
    for rep in range(int(sys.argv[2])):
        for label, settings in (("old", {"c_max_rows": 1 << 30}), ("new", {})):
            ids = llm.get_tokenizer()(text)["input_ids"][rep * 7: rep * 7 + n]
            with hybrid_settings(**settings):
                t0 = time.perf_counter()
                llm.generate({"prompt_token_ids": ids}, sp)
                dt = time.perf_counter() - t0
            print(f"{n} tokens {label}: {dt:.2f} s", flush=True)
