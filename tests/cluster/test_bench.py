"""`specray bench offline` runs end to end on a tiny model and writes consistent JSON/Markdown/PNG."""

import json

from specray.cluster.bench_report import SCHEMA
from specray.cluster.cli import main


def test_bench_offline_end_to_end(tiny_target, tmp_path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"category": c, "turns": [f"w{10 + i} w{20 + i} w{10 + i} w{20 + i}"]}
            for i, c in enumerate(["writing", "math", "writing", "coding", "math"])]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    code = main(["bench", "offline", "--model", str(tiny_target), "--dataset", str(data), "--num-prompts", "4",
                 "--max-tokens", "5", "--batch-sizes", "1,2", "--temperatures", "0,1", "--draft-num-layers", "1",
                 "--out", str(out)])
    assert code == 0
    report = json.loads((out / "offline.json").read_text())
    assert report["schema"] == SCHEMA and (out / "offline.md").read_text().startswith("model ")
    assert (out / "offline.png").read_bytes()[:4] == b"\x89PNG"
    cells = {(c["method"], c["batch_size"], c["temperature"]): c for c in report["cells"]}
    assert len(cells) == 8 * 2 * 2
    assert cells[("hf_assisted", 2, 0.0)]["skipped"] and cells[("specray_draft_padded", 1, 0.0)]["skipped"]
    for c in report["cells"]:
        if not c["skipped"]:
            assert c["requests"] == 4 and c["tokens"] == 4 * 5  # every request generated max_tokens
            assert abs(c["tokens_per_s"] - c["tokens"] / c["seconds"]) < 0.01 * c["tokens_per_s"] + 0.01
    for m in ("specray", "specray_ngram", "specray_draft"):  # greedy, batch 1: token-identical to transformers
        assert cells[(m, 1, 0.0)]["greedy_matches_hf"] is True
    assert cells[("specray_draft", 2, 0.0)]["acceptance_length"] >= 1.0
    assert set(cells[("specray", 1, 0.0)]["per_category"]) == {"writing", "math", "coding"}
    assert report["summary"]["specray_plain_vs_hf_plain_batch1"] is not None
