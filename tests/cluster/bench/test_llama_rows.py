"""llama.cpp rows in `specray bench offline`: llama-bench's JSON becomes a batch-1 greedy row (a fake
llama-bench stands in: tests never need llama.cpp), and missing builds or non-GGUF models are said."""

import json
import stat
from types import SimpleNamespace

import pytest

from specray.cluster.bench.llama_cpp import find_llama_binary, llama_bench_cell, llama_cells
from specray.cluster.bench.report import cell_json

RECORDS = [{"n_prompt": 0, "n_gen": 64, "avg_ts": 128.0, "model_filename": "m.gguf"}]


def fake_bench(folder, records=RECORDS, code=0):
    binary = folder / "llama-bench"
    binary.write_text(f"#!/bin/sh\necho '{json.dumps(records)}'\necho 'args: '$@ >&2\nexit {code}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def test_llama_bench_json_becomes_a_batch_one_row(tmp_path):
    cell = llama_bench_cell(fake_bench(tmp_path), tmp_path / "m.gguf", max_tokens=64, threads=2)
    row = cell_json(cell, None, None)
    assert (row["method"], row["batch_size"], row["temperature"]) == ("llama_bench", 1, 0.0)
    assert row["tokens_per_s"] == pytest.approx(128.0) and row["greedy_matches_hf"] is None


def test_failures_and_missing_builds_are_clear(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="failed"):
        llama_bench_cell(fake_bench(tmp_path, code=3), tmp_path / "m.gguf", 64, 2)
    with pytest.raises(ValueError, match="no generation"):
        llama_bench_cell(fake_bench(tmp_path, records=[{"n_prompt": 512, "n_gen": 0, "avg_ts": 1.0}]),
                         tmp_path / "m.gguf", 64, 2)
    with pytest.raises(ValueError, match="no llama-bench executable"):
        find_llama_binary("llama-bench", str(tmp_path / "nowhere"))
    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path / "cache"))
    assert find_llama_binary("llama-bench", None) is None
    logged = []
    args = SimpleNamespace(llama_cpp=None, batch_sizes=[1], temperatures=[0.0], model="smollm2-135m", max_tokens=8)
    assert llama_cells(args, 2, logged.append) == [] and "no llama-bench" in logged[0]
    assert "no llama-lookup" in logged[1] and "no llama-batched-bench" in logged[2]
    logged.clear()
    args.model = str(tmp_path)  # a folder, not a GGUF file
    assert llama_cells(args, 2, logged.append) == [] and "no GGUF" in logged[0]


def fake_tool(folder, name, text, stream="stderr"):
    binary = folder / name
    target = ">&2" if stream == "stderr" else ""
    binary.write_text("#!/bin/sh\ncat <<'EOF' " + target + "\n" + text + "\nEOF\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def test_lookup_and_batched_bench_rows(tmp_path, monkeypatch):
    from specray.cluster.bench import llama_cpp

    lookup = fake_tool(tmp_path, "llama-lookup", "decoded   64 tokens in    0.500 seconds, speed:  128.000 t/s\n"
                       "n_drafted    = 40\nn_accept     = 22")
    cell = llama_cpp.llama_lookup_cell(lookup, tmp_path / "m.gguf", ["a", "b"], 64, 2, 3)
    assert (cell.tokens, cell.seconds, cell.drafted, cell.accepted) == (128, 1.0, 80, 44)
    lines = "\n".join(json.dumps({"pp": 128, "tg": 64, "pl": b, "t": 64 / 50.0}) for b in (4, 8))
    batched = fake_tool(tmp_path, "llama-batched-bench", lines, stream="stdout")
    cells = llama_cpp.llama_batched_cells(batched, tmp_path / "m.gguf", [4, 8], 64, 2)
    assert [(c.batch_size, c.tokens / c.seconds) for c in cells] == [(4, 200.0), (8, 400.0)]
    fake_bench(tmp_path)
    monkeypatch.setattr(llama_cpp, "gguf_of", lambda model: tmp_path / "m.gguf", raising=False)
    import specray.cluster.bench.side_by_side as sbs
    monkeypatch.setattr(sbs, "gguf_of", lambda model: tmp_path / "m.gguf")
    args = SimpleNamespace(llama_cpp=str(tmp_path), batch_sizes=[1, 4, 8], temperatures=[0.0], model="x.gguf",
                           max_tokens=64, num_speculative_tokens=3)
    methods = [(c.method, c.batch_size) for c in llama_cells(args, 2, print, prompts=["a"])]
    assert methods == [("llama_bench", 1), ("llama_lookup", 1), ("llama_batched", 4), ("llama_batched", 8)]
