"""kernels/drafters/registry.py is the one table of methods: the config, the CLI, the README and
the Helm schema agree with it, its checks name the bad key, and one entry adds a method."""

import json
import re
from pathlib import Path

import pytest

from specray.cluster.cli import build_parser
from specray.cluster.config.speculative import METHODS as CONFIG_METHODS
from specray.cluster.config.speculative import SpeculativeConfig
from specray.kernels.drafters import registry
from specray.kernels.drafters.ngram import NgramDrafter
from specray.kernels.drafters.options import DraftOptions

ROOT = Path(__file__).resolve().parents[3]


def readme_methods() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- methods: generated from kernels/drafters/registry.py -->")[1].split("<!-- /methods -->")[0]
    return re.findall(r"^\| `(\w+)` \| (.+?) \|$", block, re.M)


def test_readme_lists_the_registry():
    assert readme_methods() == [(m.name, m.summary) for m in registry.METHODS.values()]


def test_config_cli_and_helm_derive_from_the_registry():
    assert CONFIG_METHODS == tuple(registry.METHODS)
    sub = build_parser()._subparsers._group_actions[0].choices
    for command in ("generate", "serve"):
        action = next(a for a in sub[command]._actions if a.dest == "speculative_method")
        # freedave: diffusion LMs' own method (cluster/config/diffusion.py), not a drafter
        assert list(action.choices) == [*registry.METHODS, "freedave", "none"]
    drafter = next(a for a in sub["drafter"]._actions if a.dest == "method")
    assert list(drafter.choices) == list(registry.METHODS)
    schema = json.loads((ROOT / "helm/specray/values.schema.json").read_text())
    helm = schema["properties"]["speculation"]["properties"]["method"]["enum"]
    assert set(helm) - {"default", "none", "freedave"} <= set(registry.METHODS)


@pytest.mark.parametrize("options, message", [
    ({"name": "medusa"}, "unknown speculative method 'medusa'"),
    ({"name": "draft_model"}, "needs a draft 'model'"),
    ({"name": "ngram", "tree": {"kind": "topk"}}, "'tree' needs method 'draft_model' or 'eagle'"),
    ({"name": "aded", "lookup_first": True}, "'lookup_first' needs method 'draft_model' or 'eagle'"),
    ({"name": "ngram", "aded": {}}, "'aded' options need method 'aded'"),
    ({"name": "eagle", "model": "m", "tree": {"kind": "nope"}}, "kind"),
])
def test_check_options_names_the_bad_key(options, message):
    with pytest.raises(ValueError, match=message):
        registry.check_options(**options)


def test_one_entry_adds_a_method(monkeypatch):
    """A method is its builder and one entry: config validation and the worker's builder take it."""
    entry = registry.Method("echo_ngram", "ngram:build", "n-gram again, under another name")
    monkeypatch.setitem(registry.METHODS, "echo_ngram", entry)
    SpeculativeConfig.from_dict({"method": "echo_ngram", "num_speculative_tokens": 2})
    drafter = registry.build_drafter(DraftOptions("echo_ngram", prompt_lookup_max=3))
    assert isinstance(drafter, NgramDrafter)


@pytest.mark.parametrize("raw, message", [
    ({"method": ["x"]}, "method must be a string"),
    ({"method": "draft_model", "model": 5}, "model must be a string"),
    ({"method": "aded", "aded": 5}, "aded must be a mapping"),
    ({"method": "aded", "aded": {"exploration": float("nan")}}, "aded exploration must be a finite number"),
    ({"method": "aded", "aded": {"exploration": "1"}}, "aded exploration must be a finite number"),
    ({"method": "aded", "aded": {"corpus": 5}}, "aded corpus must be a string"),
    ({"method": "longspec", "model": "d", "longspec": 5}, "longspec must be a mapping"),
    ({"method": "longspec", "model": "d", "longspec": "ab"}, "longspec must be a mapping"),
    ({"method": "draft_model", "model": "d", "tree": {"kind": "rsd_c", "branching": 5}}, "rsd_c needs branching"),
    ({"method": "draft_model", "model": "d", "tree": {"kind": ["x"]}}, "tree must be a mapping with a 'kind'"),
    ({"method": "draft_model", "model": "d", "tree": {"kind": "rsd_s", "width": True}}, "tree width must be"),
    ({"method": "draft_model", "model": "d", "batch_size_schedule": 5}, "batch_size_schedule must be a list"),
    ({"method": "draft_model", "model": "d", "lookup_first": "yes"}, "must be true or a dict"),
])
def test_a_nested_option_of_the_wrong_type_is_a_value_error(raw, message):
    """Each raised a bare TypeError (unhashable list, int not iterable) through every entry point."""
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(raw)


def test_a_draft_without_a_method_names_its_method():
    """As vLLM reads the method from the draft: an eagle folder given alone was refused ("use method
    'eagle'") while the CLI's --draft-model picked eagle for it."""
    from specray.cluster.config.speculative import SpeculativeConfig

    assert SpeculativeConfig.from_dict({"model": "smollm2-135m-eagle"}).method == "eagle"
    assert SpeculativeConfig.from_dict({"model": "smollm2-135m-draft"}).method == "draft_model"
    assert SpeculativeConfig.from_dict({"model": "no-such-draft"}).method == "draft_model"  # named later
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 3}).method == "ngram"
