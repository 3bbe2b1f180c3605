"""kernels/verify/rules.py, the one place a rule is picked for a proposal and a named one checked."""

import pytest
import torch

from specray.kernels.proposal import Proposal
from specray.kernels.verify.rules import RULE_FOR_KIND, check_rule, pick_rule

CHAIN = Proposal([3, 4])
TOPK = Proposal([1, 2], parents=[-1, -1], kind="deterministic_tree")
WOR = Proposal([1, 2], draft_probs=torch.full((2, 5), 0.2), parents=[-1, -1], kind="wor_tree")


@pytest.mark.parametrize("proposal", [CHAIN, TOPK, WOR])
def test_pick_by_kind_and_greedy_for_greedy(proposal):
    assert pick_rule(proposal, greedy=True) == "greedy"
    assert pick_rule(proposal, greedy=False) == RULE_FOR_KIND[proposal.kind]
    assert pick_rule(proposal, greedy=True, configured="rrs") == "greedy"  # `verify` is for sampled requests


def test_a_configured_rule_must_be_exact_for_the_proposal():
    assert pick_rule(WOR, greedy=False, configured="rrs") == "rrs"
    with pytest.raises(ValueError, match="cannot verify a 'deterministic_tree' proposal"):
        pick_rule(TOPK, greedy=False, configured="rrs")
    assert pick_rule(Proposal([]), greedy=False, configured="kseq") == "chain"  # nothing to verify


@pytest.mark.parametrize("rule, proposal, greedy, message", [
    ("longest", CHAIN, False, "unknown verification rule"),
    ("chain", CHAIN, True, "a greedy request cannot be verified by rule 'chain'"),
    ("greedy", CHAIN, False, "a sampled request cannot be verified by rule 'greedy'"),
    ("chain", TOPK, False, "cannot verify a 'deterministic_tree' proposal"),
])
def test_check_rule_refuses_a_mismatch(rule, proposal, greedy, message):
    with pytest.raises(ValueError, match=message):
        check_rule(rule, proposal, greedy)
    check_rule(pick_rule(proposal, greedy), proposal, greedy)  # the picked rule always passes
