"""The one place that picks a verification rule for a proposal, and checks a named one.

A proposal's kind names the rule a sampled request needs (DESIGN §3):
  chain               speculative sampling (a chain; draft_probs dense or None)
  wor_tree            recursive rejection sampling: siblings drawn without replacement (RSD)
  iid                 K-SEQ: k i.i.d. draft chains sharing their prefix trie (SpecTr)
  deterministic_tree  one-sample-per-node descent: tokens chosen deterministically (top-k, ADED)
Greedy requests use the greedy longest path for every kind.
"""

from __future__ import annotations

from specray.kernels.proposal import Proposal

RULE_FOR_KIND = {"chain": "chain", "wor_tree": "rrs", "iid": "kseq", "deterministic_tree": "descent"}
KIND_OF_RULE = {rule: kind for kind, rule in RULE_FOR_KIND.items()}
SAMPLED_RULES = tuple(RULE_FOR_KIND.values())
RULES = ("greedy", *SAMPLED_RULES)


def check_rule(rule: str, proposal: Proposal, greedy: bool | None = None) -> None:
    """A rule only verifies the proposals it is exact for; a mismatch is an error, not a fallback.
    `greedy` (when known) must agree: greedy requests take the greedy rule, sampled ones never do."""
    if rule not in RULES:
        raise ValueError(f"unknown verification rule {rule!r}; choose one of {RULES}")
    if greedy is not None and greedy != (rule == "greedy"):
        raise ValueError(f"a {'greedy' if greedy else 'sampled'} request cannot be verified by rule {rule!r}")
    if rule == "greedy" or proposal.num_draft_tokens == 0:
        return
    if proposal.kind != KIND_OF_RULE[rule]:
        raise ValueError(f"verification rule {rule!r} cannot verify a {proposal.kind!r} proposal "
                         f"(it is exact only for {KIND_OF_RULE[rule]!r} proposals)")


def pick_rule(proposal: Proposal, greedy: bool, configured: str = "auto") -> str:
    """The rule that verifies `proposal` exactly: greedy for greedy requests, else by its kind.
    `configured` (speculative_config['verify']) names the only rule sampled requests may use."""
    if greedy:
        return "greedy"
    if configured == "auto" or proposal.num_draft_tokens == 0:
        return RULE_FOR_KIND[proposal.kind]
    check_rule(configured, proposal, greedy)
    return configured
