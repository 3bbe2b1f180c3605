"""The long-context table of `specray bench offline` (prompts with `context_tokens`, e.g. the packaged
cluster/bench/data/long_context.jsonl): per method and context length (2k, 4k, 8k), at batch size 1:
decode tokens/s and time per round (the prompt's prefill step left out: it is the same target work
for every method and would drown the rounds; the draft's own catch-up on the prompt stays in),
the prefill's seconds, acceptance length, and the draft's memory per sequence at that length: its
own state (draft KV, LongSpec's ring) and, for LongSpec, the mirror of the target's last-layer KV its
pool keeps (zero where a draft reads nothing of the target's).
"""

from __future__ import annotations

from pathlib import Path

from specray.cluster.bench.methods import engine_of

MIB = 1 << 20


def length_bucket(category: str) -> str | None:
    """long_4k_qa -> 4k; None for other prompts."""
    parts = category.split("_")
    return parts[1] if len(parts) >= 2 and parts[0] == "long" else None


def innermost(drafter):
    """The drafter that holds the state (under lookup-first and tree wrappers)."""
    while True:
        inner = getattr(drafter, "model_drafter", None) or getattr(drafter, "base", None)
        if inner is None:
            return drafter
        drafter = inner


def memory_per_sequence(llm, tokens: int) -> dict[str, int]:
    """Bytes a sequence of `tokens` holds on the draft side: {"own": .., "mirror": ..}."""
    drafter = innermost(llm.draft.drafter) if llm is not None and llm.draft is not None else None
    if drafter is None:
        return {"own": 0, "mirror": 0}
    ring = getattr(drafter, "layer", None)
    if ring is not None:  # LongSpec: the ring is fixed; the mirror is one target layer's KV
        c = drafter.config
        own = ring.window * (2 * c.num_kv_heads * c.head_dim * 4 + 8)
        return {"own": own, "mirror": tokens * 2 * c.num_kv_heads * c.head_dim * 4}
    cache = getattr(drafter, "cache", None)
    if cache is None:  # n-gram lookup and ADED keep token tables, no tensors per position
        return {"own": 0, "mirror": 0}
    layers, width, _, dim = cache.kv.shape
    return {"own": tokens * layers * width * dim * cache.kv.element_size(), "mirror": 0}


def long_context_rows(cells, prompts: list[dict], llms: dict, max_tokens: int) -> list[dict]:
    """Batch-1 cells' per-category counts, merged by context length."""
    context = {}
    for p in prompts:
        bucket = length_bucket(p["category"])
        if bucket is not None:
            context.setdefault(bucket, []).append(p["context_tokens"])
    rows = []
    for cell in cells:
        if cell.batch_size != 1 or cell.skipped:
            continue
        for bucket, lengths in context.items():
            counts = [c for cat, c in cell.per_category.items() if length_bucket(cat) == bucket]
            if not counts:
                continue
            tokens, seconds = sum(c.tokens for c in counts), sum(c.seconds for c in counts)
            rounds, emitted = sum(c.rounds for c in counts), sum(c.emitted for c in counts)
            prefill, requests = sum(c.prefill_seconds for c in counts), sum(c.requests for c in counts)
            decode = seconds - prefill  # every token after each request's first (which the prefill gives)
            mean_context = round(sum(lengths) / len(lengths))
            memory = memory_per_sequence(llms.get(engine_of(cell.method)), mean_context + max_tokens)
            rows.append({"method": cell.method, "temperature": cell.temperature, "context": bucket,
                         "context_tokens": mean_context,
                         "decode_tokens_per_s": round((tokens - requests) / decode, 2) if decode > 0 else None,
                         "prefill_s": round(prefill / max(requests, 1), 4),
                         "acceptance_length": round(emitted / rounds, 3) if rounds else None,
                         "ms_per_round": round(1e3 * decode / rounds, 2) if rounds else None,
                         "draft_own_mib": round(memory["own"] / MIB, 3),
                         "target_kv_mirror_mib": round(memory["mirror"] / MIB, 3)})
    return rows


COLUMNS = ("temperature", "context", "method", "decode_tokens_per_s", "acceptance_length", "ms_per_round",
           "prefill_s", "draft_own_mib", "target_kv_mirror_mib")


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    order = sorted(rows, key=lambda r: (r["temperature"], int(r["context"].rstrip("k")), r["method"]))
    lines += ["| " + " | ".join("-" if r[c] is None else str(r[c]) for c in COLUMNS) + " |" for r in order]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specray.cluster.bench.report import method_style

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(2, len(temps), figsize=(6 * len(temps), 7), squeeze=False)
    methods = sorted({r["method"] for r in rows})
    for col, temp in enumerate(temps):
        for method in methods:
            pts = sorted((r["context_tokens"], r["decode_tokens_per_s"], r["draft_own_mib"]) for r in rows
                         if r["method"] == method and r["temperature"] == temp and r["decode_tokens_per_s"])
            if pts:
                x, tps, mem = zip(*pts)
                style = method_style(method)
                axes[0][col].plot(x, tps, **style)
                axes[1][col].plot(x, mem, **style)
        axes[0][col].set(title=f"temperature {temp}", xlabel="context tokens", ylabel="decode tokens/s")
        axes[1][col].set(xlabel="context tokens", ylabel="draft's own memory per sequence (MiB)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
