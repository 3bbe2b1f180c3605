"""Shared pieces of the engine tests: ragged greedy prompts, the exact distribution of a sampled
second token, and the chi-square p-value of emitted tokens against it."""

import numpy as np
import torch
from scipy.stats import chisquare

from specray import SamplingParams

PROMPT = {"prompt_token_ids": [1, 17, 40, 23]}
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def prompts(n, seed=0):
    # ragged prompt lengths; repeated motifs give n-gram lookup something to find
    out = []
    for i in range(n):
        motif = [3 + (seed * 31 + i * 7 + j * 13) % 90 for j in range(3 + i % 4)]
        out.append({"prompt_token_ids": [1] + motif * (1 + i % 3) + [5 + i % 50]})
    return out


def exact_second_token_distribution(llm, ids=None):
    """P(token 2) = sum_t1 q(t1 | prompt) q(t2 | prompt, t1), from the target's own logits."""
    from transformers import AutoModelForCausalLM

    ids = ids or PROMPT["prompt_token_ids"]
    model = AutoModelForCausalLM.from_pretrained(llm.model_name, dtype=torch.float32).eval()
    with torch.no_grad():
        q1 = model(torch.tensor([ids])).logits[0, -1].softmax(-1)  # [vocab]
        vocab = q1.shape[0]
        batch = torch.tensor([ids + [t] for t in range(vocab)])
        q2 = model(batch).logits[:, -1].softmax(-1)  # [vocab, vocab]
    return (q1.unsqueeze(1) * q2).sum(0).double().numpy()


def chi2(tokens, want):
    expected = want * len(tokens)
    observed = np.bincount(tokens, minlength=len(want))
    big = expected >= 5  # pool small cells so the chi-square approximation holds
    obs, exp = observed[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, observed[~big].sum()), np.append(exp, expected[~big].sum())
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def second_tokens(llm, n):
    """Token 2 is the first one a speculative round emits (accepted or recovered); max_tokens=4
    leaves that round room for 2 draft tokens."""
    sp = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True)
    outs = llm.generate([PROMPT] * n, sp)
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0.1 * drafted < accepted < 0.9 * drafted, "the test needs frequent acceptance and rejection"
    return np.array([o.outputs[0].token_ids[1] for o in outs])


def exact_joint_of_tokens_2_and_3(folder, prompt):
    """P(t2, t3) = sum_t1 q(t1 | prompt) q(t2 | prompt, t1) q(t3 | prompt, t1, t2), from transformers'
    logits, flattened to [vocab_size * vocab_size] (index t2 * vocab_size + t3)."""
    from transformers import AutoModelForCausalLM

    ids = prompt["prompt_token_ids"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        q1 = model(torch.tensor([ids])).logits[0, -1].softmax(-1).double()  # [V]
        v = q1.shape[0]
        q2 = model(torch.tensor([ids + [a] for a in range(v)])).logits[:, -1].softmax(-1).double()  # [V, V]
        pairs = torch.tensor([ids + [a, b] for a in range(v) for b in range(v)])  # [V * V, len + 2]
        q3 = torch.cat([model(chunk).logits[:, -1].softmax(-1) for chunk in pairs.split(2048)]).double()
    joint = q1[:, None, None] * q2[:, :, None] * q3.view(v, v, v)  # [t1, t2, t3]
    return joint.sum(0).reshape(-1).numpy()


def chi2_joint(tokens, want):
    """Chi-square p-value of token indices against `want`, small cells pooled, empty ones dropped."""

    expected, observed = want * len(tokens), np.bincount(tokens, minlength=len(want))
    big = expected >= 5  # pool small cells so the chi-square approximation holds
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
