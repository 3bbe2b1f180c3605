"""`specray bench cluster`'s report: each path's median pass and its ratio to the in-process engine,
as Markdown."""

from __future__ import annotations

import statistics

LABELS = ("in_process", "ray_pools", "served", "served_grpc", "served_pools", "served_pools_grpc",
          "served_pipelined", "served_ray_calls")


def median_rows(passes: list[dict]) -> dict:
    """Per path and concurrency, the pass with the median throughput (the lower one of an even count),
    with two ratios, each the median over passes (the lower of an even count) of a ratio within one
    pass, so a noisy neighbour during one pass cancels out: `vs_in_process`, the path's throughput over
    the in-process engine's at the start of the pass (no Serve app up: the engine as its users run
    it), and `vs_paired`, over the in-process run of the level just before it (`in_process_paired`:
    seconds apart, the serving stack up and idle)."""
    merged = {}
    for label in (x for x in LABELS if x in passes[0]):
        rows = list(zip(*(p[label] for p in passes)))  # [level][pass]
        merged[label] = [dict(_median(level)) for level in rows]
        for level, row in enumerate(merged[label]):
            mine = [p[label][level] for p in passes]
            starts = [p["in_process"][level]["throughput_tokens_per_s"] for p in passes]
            for key, bases in (("vs_in_process", starts), ("vs_paired", [r.get("in_process_paired") for r in mine])):
                ratios = [r["throughput_tokens_per_s"] / b for r, b in zip(mine, bases) if b]
                if ratios:
                    row[key] = round(statistics.median_low(ratios), 3)
    return merged


def _median(rows: list[dict]) -> dict:
    return sorted(rows, key=lambda r: r["throughput_tokens_per_s"])[(len(rows) - 1) // 2]


def markdown(report: dict) -> str:
    lines = [f"model {report['model']}, speculation {report['speculative_config']}, {report['max_tokens']} max "
             f"tokens, {report['num_requests']} requests per level, median of {report.get('repeats', 1)} "
             "interleaved passes (vs in-process: median of the per-pass ratios to the in-process engine at the "
             "pass's start; vs paired: to an in-process run of the level just before it, the Serve app up); prefix "
             f"caching {'on' if report.get('enable_prefix_caching') else 'off'} on every path", "",
             "| path | concurrency | tokens/s | vs in-process | vs paired | E2E p50/p99 s | TPOT p50 s |",
             "|---|---|---|---|---|---|---|"]
    base = {r["concurrency"]: r["throughput_tokens_per_s"] for r in report["in_process"]}
    for label in LABELS:
        for r in report.get(label, []):
            ratio = r.get("vs_in_process") or (r["throughput_tokens_per_s"] / base[r["concurrency"]]
                                               if base.get(r["concurrency"]) else 0)
            e, tpot = r["e2e_s"], r.get("tpot_s", {}).get("p50")
            paired = f"{r['vs_paired']:.2f}x" if r.get("vs_paired") else "-"
            lines.append(f"| {label} | {r['concurrency']} | {r['throughput_tokens_per_s']} | {ratio:.2f}x | {paired} | "
                         f"{e['p50']}/{e['p99']} | {tpot if tpot is not None else '-'} |")
    lines += ["", "Where a round's time goes (ms a round; compute: inside the worker; served rows count every "
              "round of the level, requests arriving and leaving included):", "",
              "| path | concurrency | rounds | wall | target wait | target compute | draft wait | draft compute | "
              "router |", "|---|---|---|---|---|---|---|---|---|"]
    for label in LABELS:
        for r in report.get(label, []):
            if "round_ms" in r:
                m = r["round_ms"]
                lines.append(f"| {label} | {r['concurrency']} | {m['rounds']} | {m['wall']} | {m['target_wait']} | "
                             f"{m['target_compute']} | {m['draft_wait']} | {m['draft_compute']} | {m['router']} |")
    if report.get("transports"):
        lines += ["", "| draft transport | bytes sent/round | bytes received/round | round trip ms | tokens/s |",
                  "|---|---|---|---|---|"]
        for t in report["transports"]:
            lines.append(f"| {t['transport']} | {t['bytes_sent_per_round']} | {t['bytes_received_per_round']} | "
                         f"{t['round_trip_ms']} | {t['throughput_tokens_per_s']} |")
    return "\n".join(lines) + "\n"
