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
    assert "no llama-lookup" in logged[1] and "no llama-speculative-simple" in logged[2]
    assert "no llama-batched-bench" in logged[3]
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
    assert (cell.tokens, cell.seconds, cell.drafted, cell.accepted) == (126, 1.0, 80, 44)  # less the prefill's token
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


def test_draft_model_speculation_row(tmp_path, monkeypatch):
    """llama-speculative-simple runs with the draft's GGUF and the draft-simple type; its log becomes a
    batch-1 row as llama-lookup's does; without a standalone draft the row is said, not run."""
    from specray.cluster.bench import llama_cpp
    from specray.cluster.bench.report import decode_tokens_per_s

    log = "decoded   32 tokens in    0.250 seconds, speed:  128.000 t/s\nn_drafted = 30\nn_accept  = 12"
    spec = fake_tool(tmp_path, "llama-speculative-simple", log)
    record_argv = f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv'}\n"
    spec.write_text(spec.read_text().replace("#!/bin/sh\n", record_argv))
    cell = llama_cpp.llama_speculative_cell(spec, tmp_path / "m.gguf", tmp_path / "d.gguf", ["a", "b"], 32, 2, 3)
    assert cell.method == "llama_speculative"
    assert (cell.tokens, cell.seconds, cell.drafted, cell.accepted) == (62, 0.5, 60, 24)
    assert decode_tokens_per_s(cell) == 124.0
    argv = (tmp_path / "argv").read_text().split()
    assert "--ignore-eos" in argv  # past EOS, as specray's rows
    assert argv[argv.index("-md") + 1].endswith("d.gguf") and argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3" and argv[-1] == "b"
    fake_tool(tmp_path, "llama-speculative-simple", "no statistics here")
    with pytest.raises(ValueError, match="llama-speculative-simple printed no decode statistics"):
        llama_cpp.llama_speculative_cell(spec, tmp_path / "m.gguf", tmp_path / "d.gguf", ["a"], 32, 2, 3)
    with pytest.raises(ValueError, match="no standalone draft"):
        llama_cpp.llama_draft_file(None, tmp_path / "m.gguf")
    assert llama_cpp.llama_draft_file(str(tmp_path / "d.gguf"), tmp_path / "m.gguf") == tmp_path / "d.gguf"
    import specray.cluster.bench.side_by_side as sbs
    monkeypatch.setattr(sbs, "gguf_of", lambda model: tmp_path / "m.gguf")
    logged = []
    args = SimpleNamespace(llama_cpp=str(tmp_path), batch_sizes=[1], temperatures=[0.0], model="x.gguf",
                           max_tokens=32, num_speculative_tokens=3, draft_model=None)
    assert llama_cells(args, 2, logged.append, prompts=["a"]) == []
    assert any("llama-speculative-simple: no standalone draft" in line for line in logged)
