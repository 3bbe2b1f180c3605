"""Distillation data for `specray distill`: the target's own responses, with its top-k distributions.

Prompts are template x topic from a seed file (default: `data/distill_prompts.json`, written for
specray, disjoint from Spec-Bench/MT-Bench and from the tests), shuffled with a fixed seed. The
target answers each one through the specray engine (greedy by default) and returns, for every
response token, its top-`top_k` log-probabilities: the teacher distribution the draft is trained to
match (KL), at no extra forward pass. Shards are written one at a time, so a run resumes where it
stopped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.kernels.chat import prompt_token_ids

SEED_PROMPTS = Path(__file__).parent / "data" / "distill_prompts.json"


def seed_prompts(path: Path | None = None, seed: int = 0) -> list[str]:
    """Every template x topic prompt of a seed file, in a fixed shuffled order."""
    path = Path(path or SEED_PROMPTS)
    if not path.exists():
        raise ValueError(f"prompt seed file {path} does not exist")
    if path.suffix == ".jsonl":  # a plain prompt list: {"prompt": ...} per line
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        # rows without a prompt: only the settings/draw bookkeeping of a self_prompts.jsonl
        if any("prompt" not in r and not set(r) <= {"draw", "settings"} for r in rows):
            raise ValueError(f"prompt file {path}: every line needs a 'prompt'")
        prompts = [r["prompt"] for r in rows if "prompt" in r]
    else:
        raw = json.loads(path.read_text())
        prompts = [t.format(topic=topic) for t in raw["templates"] for topic in raw["topics"]]
    random.Random(seed).shuffle(prompts)
    return prompts



@dataclass
class Sample:
    """One prompt and the target's response, with the teacher distribution at each response token."""

    prompt_ids: list[int]
    response_ids: list[int]  # [T]
    top_ids: torch.Tensor  # [T, top_k] int32: the target's most likely tokens at each response position
    top_logprobs: torch.Tensor  # [T, top_k] float16: their log-probabilities

    def __post_init__(self) -> None:
        assert self.top_ids.shape == self.top_logprobs.shape and self.top_ids.shape[0] == len(self.response_ids)


def _teacher_rows(logprobs: list[dict[int, float]], top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(logprobs), top_k, dtype=torch.int32)
    vals = torch.full((len(logprobs), top_k), -1e4, dtype=torch.float32)
    for j, entry in enumerate(logprobs):
        best = sorted(entry.items(), key=lambda kv: -kv[1])[:top_k]
        ids[j, :len(best)] = torch.tensor([t for t, _ in best], dtype=torch.int32)
        vals[j, :len(best)] = torch.tensor([v for _, v in best])
    return ids, vals.half()


def generate_shards(llm, prompts: list[str], out: Path, shard_size: int, max_tokens: int, top_k: int,
                    temperature: float = 0.0, progress=None) -> list[Path]:
    """Answer `prompts` with the target in shards of `shard_size` (skipping shards already on disk)."""
    from specray.cluster.params import SamplingParams

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, start in enumerate(range(0, len(prompts), shard_size)):
        path = out / f"shard-{s:05d}.pt"
        paths.append(path)
        group = prompts[start:start + shard_size]
        ids = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in group]
        if path.exists():
            check_shard(path, ids)
            if progress is not None:
                progress.update(len(group))
            continue
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=top_k, seed=start)
        outs = llm.generate([{"prompt_token_ids": x} for x in ids], params)
        samples = []
        for prompt_ids, o in zip(ids, outs, strict=True):
            top_ids, top_lp = _teacher_rows(o.outputs[0].logprobs, top_k)
            samples.append(Sample(prompt_ids, list(o.outputs[0].token_ids), top_ids, top_lp).__dict__)
        _write_shard(samples, path, progress, len(group))
    return paths


def check_shard(path: Path, prompt_ids: list[list[int]]) -> None:
    """A shard found on disk is reused only if it answers exactly these prompts: a run whose prompt
    list changed (--prompts, --self-prompts, --seed) would otherwise train on its held-out prompts."""
    if [list(d["prompt_ids"]) for d in torch.load(path, weights_only=False)] != prompt_ids:
        raise ValueError(f"{path} answers other prompts than this run's (the prompt list changed since it was "
                         "written: --prompts, --self-prompts or --seed); use a new --out or --data folder")


def load_samples(paths: list[Path]) -> list[Sample]:
    return [Sample(**d) for p in paths for d in torch.load(p, weights_only=False)]


@torch.no_grad()
def generate_shards_hf(model, tokenizer, prompts: list[str], out: Path, shard_size: int, max_tokens: int,
                       top_k: int, eos_token_ids: list[int], temperature: float = 0.0, progress=None) -> list[Path]:
    """Like `generate_shards` through transformers `generate` (left-padded batches): the fast path
    on a GPU. The target's top-k log-probabilities come from the same logits that chose each token."""
    out.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    pad = eos_token_ids[0]
    paths = []
    for s, start in enumerate(range(0, len(prompts), shard_size)):
        path = out / f"shard-{s:05d}.pt"
        paths.append(path)
        group = prompts[start:start + shard_size]
        ids = [prompt_token_ids(tokenizer, p) for p in group]
        if path.exists():
            check_shard(path, ids)
            if progress is not None:
                progress.update(len(group))
            continue
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
            else dict(do_sample=False)
        torch.manual_seed(start)
        gen = model.generate(input_ids, attention_mask=mask, max_new_tokens=max_tokens, eos_token_id=eos_token_ids,
                             pad_token_id=pad, return_dict_in_generate=True, output_logits=True, **sampling)
        logits = torch.stack(gen.logits, 1)  # [batch, steps, vocab_size]
        top = logits.float().log_softmax(-1).topk(top_k, dim=-1)
        top_ids, top_lp = top.indices.int().cpu(), top.values.half().cpu()
        tokens = gen.sequences[:, width:].cpu()
        samples = []
        for b, prompt_ids in enumerate(ids):
            row = tokens[b].tolist()
            n = next((j + 1 for j, t in enumerate(row) if t in eos_token_ids), len(row))  # through the EOS
            samples.append(Sample(prompt_ids, row[:n], top_ids[b, :n].clone(), top_lp[b, :n].clone()).__dict__)
        _write_shard(samples, path, progress, len(group))
    return paths


def _write_shard(samples: list[dict], path, progress, num_prompts: int) -> None:
    """Atomic: a shard exists whole or not at all, so a resumed run can trust every shard it finds."""
    tmp = path.with_suffix(".tmp")
    torch.save(samples, tmp)
    tmp.rename(path)
    if progress is not None:
        progress.update(num_prompts)
