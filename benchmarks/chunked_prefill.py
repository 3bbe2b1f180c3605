"""What a long prompt costs the sequences already decoding, with and without chunked prefill.

`--running` short Spec-Bench prompts decode; then a long prompt (the packaged long-context set's
first, cut to `--long-tokens`) arrives. Per `max_prefill_tokens` budget (none: every prompt whole in
one round), the router's rounds are timed from its arrival to its first token: the longest round
(the running sequences' worst gap between tokens), the long prompt's time to first token, and the
tokens the running sequences got meanwhile. Budgets run in turn, `--repeats` times each (a shared
box drifts), so compare within one run. Outputs are checked to agree across budgets.

    python benchmarks/chunked_prefill.py --budgets none,512,256 --running 7 --long-tokens 1500
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from specray.kernels.kernel_modes import KERNEL_MODES

SHORT_TOKENS = 400  # the running sequences' max_tokens: more than the rounds a run takes


def one_run(llm, short: list[list[int]], long: list[int]) -> dict:
    from specray import SamplingParams

    router = llm.router
    params = SamplingParams(temperature=0.0, max_tokens=SHORT_TOKENS, ignore_eos=True)
    ids = [router.add_request(p, params) for p in short]
    seqs = [router.requests[i].seqs[0] for i in ids]
    while router.waiting or any(s.prefilling for s in seqs):  # every short prompt prefilled and decoding
        router.step()
    long_id = router.add_request(long, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    before = [len(s.output_token_ids) for s in seqs]
    rounds, start = [], time.perf_counter()
    first = None
    while first is None:
        t = time.perf_counter()
        for out in router.step():
            if out.request_id == long_id:
                first = out.outputs[0].token_ids
        rounds.append(time.perf_counter() - t)
    ttft = time.perf_counter() - start
    assert all(not s.finished for s in seqs), "the short requests ran out of tokens: raise SHORT_TOKENS"
    gained = sum(len(s.output_token_ids) - b for s, b in zip(seqs, before))
    outputs = [list(s.output_token_ids) for s in seqs]
    for i in ids:
        router.abort(i)
    return {"longest_round_ms": 1e3 * max(rounds), "rounds": len(rounds), "ttft_s": ttft,
            "running_tokens_meanwhile": gained, "outputs": outputs + [first]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="none,512,256", help="max_prefill_tokens values, comma-separated; none: no bound; auto: the default")
    ap.add_argument("--running", type=int, default=7, help="short sequences decoding when the long prompt arrives")
    ap.add_argument("--long-tokens", type=int, default=1500, help="the long prompt's tokens")
    ap.add_argument("--kernels", choices=list(KERNEL_MODES), default="exact", help="the target's CPU kernels")
    ap.add_argument("--repeats", type=int, default=3, help="runs per budget, the budgets in turn")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    from specray import LLM
    from specray.cluster.bench.prompts import LONG_CONTEXT, SHARED_PROMPTS, load_prompts
    from specray.kernels.chat import prompt_token_ids

    budgets = [None if b == "none" else b if b == "auto" else int(b) for b in args.budgets.split(",")]
    llms = {b: LLM("smollm2-135m", kernels=args.kernels, max_prefill_tokens=b, max_num_seqs=args.running + 1,
                    kv_cache_tokens=(args.running + 1) * (SHORT_TOKENS + args.long_tokens + 64),
                    enable_prefix_caching=False)  # the long prompt is prefilled again and again
            for b in budgets}
    tok = next(iter(llms.values())).tokenizer
    dataset = SHARED_PROMPTS if SHARED_PROMPTS.exists() else None
    short = [prompt_token_ids(tok, p["prompt"]) for p in load_prompts(dataset, args.running)]
    long = prompt_token_ids(tok, load_prompts(LONG_CONTEXT, 1)[0]["prompt"])[-args.long_tokens:]
    runs = {b: [] for b in budgets}
    for _ in range(args.repeats):
        for b in budgets:
            runs[b].append(one_run(llms[b], short, long))
    want = runs[budgets[0]][0]["outputs"]

    def agrees(outputs) -> bool:  # the same greedy continuations, each as far as its run went
        return all(a[:len(b)] == b[:len(a)] for a, b in zip(outputs, want, strict=True))

    report = {"kernels": args.kernels, "running": args.running, "long_tokens": len(long), "budgets": {}}
    for b in budgets:
        row = {k: statistics.median(r[k] for r in runs[b]) for k in runs[b][0] if k != "outputs"}
        row["outputs_agree"] = all(agrees(r["outputs"]) for r in runs[b])
        report["budgets"][str(b)] = row
        print(f"max_prefill_tokens {b}: {json.dumps(row)}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
