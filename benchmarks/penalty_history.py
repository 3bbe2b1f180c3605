"""What a step's penalties cost as a sequence grows: the rows' histories built from the whole context
(`row_histories`, the reference) against a sequence's incremental history (`SeqHistory`, what the
target worker keeps), each then through `apply_penalties` over SmolLM2's vocabulary.

    python benchmarks/penalty_history.py
"""

from __future__ import annotations

import random
import time


def main() -> None:
    import torch

    from specray.kernels.penalties import SeqHistory, apply_penalties, row_histories
    from specray.kernels.sampling import SamplingConfig

    rng, vocab, steps = random.Random(0), 49152, 50
    cfg = SamplingConfig(temperature=0.0, repetition_penalty=1.1, frequency_penalty=0.3)
    for prompt_len, output_len in [(200, 200), (1000, 1000), (1000, 3000)]:
        context = [rng.randrange(vocab) for _ in range(prompt_len)] + [rng.randrange(2000) for _ in range(output_len)]
        for rows in (1, 4):
            logits = torch.randn(rows, vocab)  # [rows, vocab]
            chain = list(range(-1, rows - 2))
            tokens = list(context)
            history = SeqHistory(prompt_len, tokens)
            history.counts()  # the tokens so far, counted as they were committed
            timed = {}
            for way in ("from scratch", "incremental"):
                start = time.perf_counter()
                for _ in range(steps):
                    if way == "incremental":
                        tokens.append(7)  # one token committed a step
                        hs = history.rows([5], chain, list(range(rows - 1)))
                    else:
                        hs = row_histories(prompt_len, context + [5], chain, list(range(rows - 1)))
                    apply_penalties(logits, [cfg] * rows, hs)
                timed[way] = (time.perf_counter() - start) / steps * 1e6
            print(f"prompt {prompt_len}, output {output_len}, {rows} rows: from scratch {timed['from scratch']:.0f} us, "
                  f"incremental {timed['incremental']:.0f} us a step")


if __name__ == "__main__":
    main()
