"""The long-context table of `specray bench offline`: rows per method and context length, the
LongSpec draft's own memory constant in the length while a draft model's KV grows, the packaged
prompt set within the target's context and disjoint from what LongSpec trains on."""

import json

import pytest

from specray.cluster.bench.prompts import LONG_CONTEXT, load_prompts
from specray.cluster.cli import main



def test_long_context_table(tiny_target, tiny_draft, tiny_longspec, tmp_path):
    data = tmp_path / "long.jsonl"
    rows = [{"category": f"long_{k}k_qa", "context_tokens": 40 * k, "prompt": " ".join(f"w{10 + (i * 7) % 80}"
             for i in range(40 * k))} for k in (1, 2, 4) for _ in range(2)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    methods = "specray,specray_ngram,specray_draft,specray_draft_topk,specray_longspec,specray_longspec_topk"
    assert main(["bench", "offline", "--model", str(tiny_target), "--dataset", str(data), "--num-prompts", "6",
                 "--max-tokens", "6", "--batch-sizes", "1", "--temperatures", "0", "--methods", methods,
                 "--draft-model", str(tiny_draft), "--draft-num-layers", "2", "--longspec-model", str(tiny_longspec),
                 "--out", str(out)]) == 0
    report = json.loads((out / "offline.json").read_text())
    table = {(r["method"], r["context"]): r for r in report["long_context"]}
    assert set(table) == {(m, f"{k}k") for m in methods.split(",") for k in (1, 2, 4)}
    assert (out / "long_context.md").read_text().startswith("| temperature | context |")
    assert (out / "long_context.png").read_bytes()[:4] == b"\x89PNG"
    for k in (1, 2, 4):
        assert table[("specray_longspec", f"{k}k")]["draft_own_mib"] == table[("specray_longspec", "1k")]["draft_own_mib"]
        assert table[("specray_longspec", f"{k}k")]["target_kv_mirror_mib"] > 0
        assert table[("specray_ngram", f"{k}k")]["draft_own_mib"] == 0
        assert table[("specray", f"{k}k")]["acceptance_length"] == 1.0
    assert table[("specray_draft", "4k")]["draft_own_mib"] > table[("specray_draft", "1k")]["draft_own_mib"]
    assert all(table[(m, "1k")]["decode_tokens_per_s"] > 0 and table[(m, "1k")]["prefill_s"] > 0
               for m in methods.split(","))
    outputs = {c["method"]: c for c in report["cells"]}
    assert outputs["specray_longspec"]["drafted"] > 0 and outputs["specray_longspec_topk"]["drafted"] > 0


def test_longspec_methods_need_a_draft(tiny_target, tmp_path, capsys):
    assert main(["bench", "offline", "--model", str(tiny_target), "--methods", "specray_longspec", "--out",
                 str(tmp_path)]) != 0
    assert "--longspec-model" in capsys.readouterr().err


def test_the_packaged_long_prompts_fit_and_stay_apart_from_training():
    prompts = load_prompts(LONG_CONTEXT, 100)
    lengths = {p["category"].split("_")[1] for p in prompts}
    assert lengths == {"2k", "4k", "8k"} and len(prompts) == 12
    for p in prompts:
        limit = int(p["category"].split("_")[1].rstrip("k")) * 1024
        assert limit // 2 < p["context_tokens"] <= limit - 256  # room to answer within the context
    spec_bench = LONG_CONTEXT.parents[4] / "shared" / "data" / "spec_bench" / "question.jsonl"
    if not spec_bench.exists():
        pytest.skip("Spec-Bench is not here")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_long", LONG_CONTEXT.parents[3] / "scripts" / "make_long_context.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    train_articles, train_rag = make.documents(spec_bench, "train")
    text = "\n".join(p["prompt"] for p in prompts)
    assert not any(a[:200] in text for a in train_articles) and not any(q in text for _, q in train_rag)
