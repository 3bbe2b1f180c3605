"""Every command's options explain themselves (`specray bench`'s too), and every method looks different in the plots."""

import argparse

from specray.cluster.bench.methods import METHODS
from specray.cluster.bench.report import method_style
from specray.cluster.cli import build_parser


def subcommands(parser: argparse.ArgumentParser) -> dict:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_every_option_of_every_command_has_help_text():
    """generate, drafter and distill had options without any (their defaults were shown nowhere)."""
    def missing(parser, path):
        found = [(path, a.option_strings[0]) for a in parser._actions
                 if a.option_strings and not a.help and "-h" not in a.option_strings]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found += missing(child, f"{path} {name}")
        return found

    parser = build_parser()
    assert {"generate", "serve", "drafter", "distill", "bench"} <= set(subcommands(parser))
    assert missing(parser, "specray") == []


def test_every_bench_option_has_help_text():
    kinds = subcommands(subcommands(build_parser())["bench"])
    assert set(kinds) >= {"offline", "serve", "cluster", "easyspec"}
    missing = {name: [a.option_strings[0] for a in p._actions if a.option_strings and not a.help]
               for name, p in kinds.items()}
    assert missing == {name: [] for name in kinds}


def test_every_method_has_its_own_colour_and_marker():
    styles = [method_style(m) for m in METHODS]
    assert len({s["color"] for s in styles}) == len(METHODS) <= 20
    assert len({s["marker"] for s in styles}) >= 10
    assert method_style("specray") != method_style("specray_aded")
    assert method_style("hf") != method_style("specray_rsd_s")
    llama = method_style("llama_cpp")
    assert llama["color"] == "black" and llama["linestyle"] == "--"
    batch1 = [method_style(m)["marker"] for m in ("llama_bench", "llama_lookup", "llama_speculative")]
    assert len(set(batch1)) == 3  # llama.cpp's three batch-1 points do not hide one another
    assert method_style("some_new_method")["color"] not in {"black"}


def test_a_kernel_mode_suffix_names_its_engine_and_keeps_its_base_colour():
    from specray.cluster.bench.methods import base_method, kernels_of, known_method

    assert [kernels_of(m) for m in ("specray", "specray_fast", "specray_default_fast16")] == ["exact", "fast", "fast16"]
    assert base_method("specray_default_fast16") == base_method("specray_default_fast") == "specray_default"
    assert known_method("specray_eagle_fast16") and not known_method("hf_fast16") and not known_method("specray_fast32")
    fast, fast16 = method_style("specray_default_fast"), method_style("specray_default_fast16")
    assert fast["color"] == fast16["color"] == method_style("specray_default")["color"]
    assert fast["linestyle"] != fast16["linestyle"]


def test_a_padded_method_pads_in_every_kernel_mode():
    """specray_ngram_padded_fast16 runs specray_ngram_fast16's engine on the padded baseline (the suffix
    once hid the padding: the engine ran ragged and its KV was sized unpadded)."""
    from specray.cluster.bench.methods import engine_of, is_padded, needs_padding, skip_reason

    for suffix in ("", "_fast", "_fast16"):
        padded, ragged = f"specray_ngram_padded{suffix}", f"specray_ngram{suffix}"
        assert is_padded(padded) and not is_padded(ragged) and engine_of(padded) == ragged
        assert skip_reason(padded, 1) is not None and skip_reason(padded, 2) is None
        assert needs_padding(ragged, [ragged, padded]) and not needs_padding(ragged, [ragged, "specray_draft_padded"])
    assert not needs_padding("specray_ngram_fast16", ["specray_ngram_padded_fast"])


def test_the_plot_shows_llama_cpp_rows_and_batch_one_decode_speed():
    from specray.cluster.bench.report import plot_points

    cells = [{"method": "specray", "batch_size": 1, "temperature": 0.0, "skipped": False, "tokens_per_s": 100.0,
              "decode_tokens_per_s": 150.0},
             {"method": "specray", "batch_size": 8, "temperature": 0.0, "skipped": False, "tokens_per_s": 300.0,
              "decode_tokens_per_s": None},
             {"method": "llama_bench", "batch_size": 1, "temperature": 0.0, "skipped": False, "tokens_per_s": 120.0,
              "decode_tokens_per_s": 120.0},
             {"method": "llama_batched", "batch_size": 8, "temperature": 0.0, "skipped": False, "tokens_per_s": 90.0,
              "decode_tokens_per_s": None}]
    report = {"config": {"methods": ["specray"], "temperatures": [0.0]}, "cells": cells}
    assert plot_points(report, 0.0) == {"specray": [(1, 150.0), (8, 300.0)], "llama_bench": [(1, 120.0)],
                                        "llama_batched": [(8, 90.0)]}
    assert plot_points(report, 1.0) == {}
