"""The `specray generate` CLI: streams text, prints a summary, rejects bad input with exit code 2."""

import json

import pytest

from specray.cluster.cli import main


def test_generate_streams_and_summarises(tiny_target, capsys):
    code = main(["generate", "w10 w11 w12", "--model", str(tiny_target), "--max-tokens", "6", "--ignore-eos",
                 "--no-chat-template", "--num-speculative-tokens", "2"])
    out = capsys.readouterr()
    assert code == 0
    assert 1 <= len(out.out.split()) <= 6  # word tokens streamed (special tokens print nothing)
    assert "1 request(s), 6 tokens" in out.err and "acceptance length" in out.err


def test_generate_file_with_chat_template_and_draft(tiny_target, tiny_draft, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [f"w{i} w{i + 1}"]}) for i in (10, 20)))
    code = main(["generate", "--file", str(prompts), "--model", str(tiny_target), "--max-tokens", "5",
                 "--speculative-method", "draft_model", "--draft-model", str(tiny_draft), "--ignore-eos"])
    out = capsys.readouterr()
    assert code == 0 and out.out.count("--- prompt") == 2 and "2 request(s), 10 tokens" in out.err


def test_draft_quantization_reaches_the_speculative_config():
    import argparse

    from specray.cluster.cli import speculative_config

    base = dict(model="m", speculative_method="draft_model", draft_model="d", num_speculative_tokens=2,
                draft_num_layers=None, draft_vocab_trim=None, prompt_lookup_min=None, prompt_lookup_max=None)
    assert speculative_config(argparse.Namespace(**base, draft_quantization="none"))["draft_quantization"] == "none"
    assert "draft_quantization" not in speculative_config(argparse.Namespace(**base, draft_quantization=None))


def test_generate_defaults_follow_the_device():
    """`specray generate` on CPU and on an accelerator: adaptive prompt lookup, off from two running
    sequences; asking for eagle gets smollm2-135m's packaged feature-level draft behind prompt
    lookup; the flags override each part."""
    from specray.cluster.cli import build_parser, speculative_config

    def spec(*flags):
        return speculative_config(build_parser().parse_args(["generate", "w3", *flags]))

    cpu = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "disable_by_batch_size": 2,
           "adaptive": True}
    trained = {"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 4,
               "lookup_first": {"model_tokens": 1}, "disable_by_batch_size": 2, "adaptive": True}
    assert spec() == spec("--speculative-method", "ngram") == spec("--model", "other") == cpu
    assert spec("--device", "cuda") == spec("--device", "cuda", "--model", "other") == cpu
    assert spec("--speculative-method", "eagle") == spec("--speculative-method", "eagle", "--lookup-first") == trained
    # a draft alone names its method, as in specray serve (it was refused: "ngram drafts by prompt lookup")
    assert spec("--draft-model", "smollm2-135m-eagle") == trained
    assert spec("--draft-model", "smollm2-135m-draft") == spec("--speculative-method", "draft_model")
    assert spec("--device", "cuda", "--speculative-method", "eagle") == trained
    assert spec("--prompt-lookup-min", "1", "--prompt-lookup-max", "3") == {**cpu, "prompt_lookup_min": 1,
                                                                            "prompt_lookup_max": 3}
    assert spec("--num-speculative-tokens", "3", "--disable-by-batch-size", "8") == {
        **cpu, "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    assert spec("--adaptive-speculation", "off") == {**cpu, "adaptive": False}
    assert spec("--speculative-method", "eagle", "--num-speculative-tokens", "2") == {
        **trained, "num_speculative_tokens": 2}
    assert spec("--draft-model", "smollm2-135m-draft", "--speculative-method", "draft_model") == {
        "method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 2}
    assert spec("--speculative-method", "none") is None
    # a method alone takes the target's packaged draft of that kind (never the eagle one for draft_model)
    assert spec("--speculative-method", "draft_model") == {
        "method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 2}
    assert spec("--model", "other", "--speculative-method", "draft_model")["model"] == "other"  # truncated target


def test_bad_input_is_a_clear_error(tiny_target, capsys):
    for argv, message in ([["--max-tokens", "0"], "max_tokens"], [["--top-p", "2"], "top_p"],
                          [["--num-speculative-tokens", "0"], "num_speculative_tokens"],
                   [["--disable-by-batch-size", "0"], "disable_by_batch_size"],
                          [["--file", "/no/such/file"], "does not exist"]):
        code = main(["generate", "w3", "--model", str(tiny_target), *argv])
        assert code == 2 and message in capsys.readouterr().err
    assert main(["generate", "w3", "--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    for argv, message in ([["--kv-cache-tokens", "0"], "kv_cache_tokens must be"],
                          [["--device", "bogus"], "unknown device 'bogus'"],
                          [["--speculative-method", "none", "--num-speculative-tokens", "3"],
                           "none turns speculation off; drop --num-speculative-tokens"],
                          [["--speculative-method", "ngram", "--draft-quantization", "q4_1"],
                           "--draft-quantization needs a method with a draft model"],
                          [["--speculative-method", "ngram", "--draft-model", "smollm2-135m-eagle"],
                           "--draft-model needs a method with a draft model"],
                          # SmolLM2's eagle draft on another target: every round failed at run time
                          [["--draft-model", "smollm2-135m-eagle"], "hidden_size 576, the target's is 64"],
                          # prompt lookup's flags beside another method, or beside the whole config: were dropped
                          [["--speculative-method", "eagle", "--prompt-lookup-max", "9"],
                           "--prompt-lookup-max shape prompt lookup (--speculative-method ngram); eagle ignores them"],
                          [["--speculative-config", '{"method": "ngram"}', "--prompt-lookup-max", "9"],
                           "put --prompt-lookup-max inside it"]):
        assert main(["generate", "w3", "--model", str(tiny_target), *argv]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own check of a choice
        main(["generate", "w3", "--model", str(tiny_target), "--draft-quantization", "int4"])
    assert exit_info.value.code == 2 and "--draft-quantization" in capsys.readouterr().err


@pytest.mark.parametrize("name, text, message", [
    ("p.txt", "\n  \n", "holds no prompts"), ("p.jsonl", "\n", "holds no prompts"),
    ("p.jsonl", '{"prompt": "w3"}\nnot json\n', "p.jsonl line 2: not JSON"),
    ("p.jsonl", '{"prompt": 5}\n', "line 1: needs a non-empty string 'prompt'"),
    ("p.jsonl", '{"turns": []}\n', "line 1: needs a non-empty string 'prompt'"),
    ("p.jsonl", '{"foo": "x"}\n', "line 1: needs a non-empty string 'prompt'"),
    ("p.jsonl", '["w3"]\n', "line 1: a JSON object is needed"),
])
def test_a_prompt_file_without_good_prompts_is_refused_naming_the_line(tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    assert main(["generate", "--file", str(tmp_path / name), "--model", "no-model-is-loaded"]) == 2
    assert message in capsys.readouterr().err


def test_a_prompt_not_utf8_on_the_command_line_is_one_line(capsys):
    """Python hands such argv bytes over as lone surrogates; the tokenizer raised TypeError on them."""
    assert main(["generate", "w3 \udcff", "--model", "no-model-is-loaded"]) == 2
    assert "prompt 1 of the command line is not UTF-8 text" in capsys.readouterr().err


def test_an_upper_case_jsonl_suffix_is_read_as_jsonl(tmp_path):
    from specray.cluster.cli import build_parser, read_prompts

    (tmp_path / "p.JSONL").write_text('{"prompt": "w3 w4"}\n')
    assert read_prompts(build_parser().parse_args(["generate", "--file", str(tmp_path / "p.JSONL")])) == ["w3 w4"]


def test_a_prompt_path_that_is_no_text_file_is_one_line(tmp_path, capsys):
    (tmp_path / "bytes.txt").write_bytes(b"\xff\xfe hello\n")
    for path, message in ((tmp_path, "is not a file"), (tmp_path / "bytes.txt", "is not UTF-8 text")):
        assert main(["generate", "--file", str(path), "--model", "no-model-is-loaded"]) == 2
        assert message in capsys.readouterr().err


def test_a_drafter_port_outside_the_range_is_refused(capsys):
    for port in ("70000", "-1", "http"):
        with pytest.raises(SystemExit) as exit_info:
            main(["drafter", "--method", "ngram", "--port", port])
        assert exit_info.value.code == 2 and "--port" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--dtype", "int8"], "unknown dtype 'int8'"), (["--device", "banana"], "unknown device 'banana'"),
    (["--kv-cache-tokens", "8"], "kv_cache_tokens must be an integer >= block_size"),
    (["--host", "nonsense.invalid"], "cannot listen on nonsense.invalid:0"),
])
def test_a_drafter_with_bad_settings_is_one_line_before_it_serves(capsys, flags, message):
    """Each once served (dtype, device), hit a bare assertion or gRPC's bind error."""
    assert main(["drafter", "--method", "ngram", "--port", "0", *flags]) == 2
    assert message in capsys.readouterr().err


def test_speculative_config_json_is_the_whole_config(tiny_target, tiny_draft, capsys):
    """--speculative-config (vLLM's flag) passes trees, budgets and lookup_first through as given; a
    tree config generates; beside another speculation flag, or not a JSON object, it is refused."""
    from specray.cluster.cli import build_parser, speculative_config

    tree = {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 3,
            "tree": {"kind": "topk", "k": 2, "width": 2}, "verify_budget": 5, "lookup_first": True}
    flags = ["--speculative-config", json.dumps(tree)]
    assert speculative_config(build_parser().parse_args(["generate", "w3", *flags])) == tree
    code = main(["generate", "w10 w11 w12", "--model", str(tiny_target), "--max-tokens", "6", "--ignore-eos",
                 "--no-chat-template", *flags])
    assert code == 0 and "1 request(s), 6 tokens" in capsys.readouterr().err
    assert main(["generate", "w3", "--model", str(tiny_target), *flags, "--num-speculative-tokens", "2"]) == 2
    assert "put --num-speculative-tokens inside it" in capsys.readouterr().err
    bad_tree = json.dumps({**tree, "tree": {"kind": "magic"}})
    assert main(["generate", "w3", "--model", str(tiny_target), "--speculative-config", bad_tree]) == 2
    assert "unknown tree kind" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "w3", "--speculative-config", "[1, 2]"])
    assert exit_info.value.code == 2 and "expected a JSON object" in capsys.readouterr().err


def test_the_drafter_listens_on_loopback_unless_told():
    """It has no authentication: every interface only when asked for, as specray serve's HTTP."""
    from specray.cluster.cli import build_parser

    assert build_parser().parse_args(["drafter", "--method", "ngram"]).host == "127.0.0.1"


def test_an_unknown_flag_is_refused_with_its_commands_usage(capsys):
    """argparse's top level reported it, under the list of commands."""
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--dry-run", "--block-size", "7"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "specray serve: error: unrecognized arguments: --block-size 7" in err
