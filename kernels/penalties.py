"""What reads the tokens before a row: repetition, frequency and presence penalties (vLLM's and
OpenAI's), bad_words and min_tokens.

A row's processing reads the prompt (repetition only) and the output so far, which in a
verification step includes the draft tokens on the row's path. So every row of a speculative step
is processed exactly as a one-row step at its position would be, and greedy speculative output
equals greedy plain output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels.sampling import SamplingConfig


@dataclass(frozen=True)
class RowHistory:
    """The tokens before a row's position: the prompt's, then the output's (drafts on its path included)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]


def penalize_row(row: torch.Tensor, cfg: SamplingConfig, history: RowHistory) -> torch.Tensor:
    """row [vocab_size] -> the row penalised (a new tensor): a logit of a token seen in the prompt
    or the output is divided by repetition_penalty when positive, multiplied when not; then each
    output occurrence subtracts frequency_penalty, and any occurrence presence_penalty once."""
    vocab = row.shape[0]
    out = row.float().clone()
    counts = torch.bincount(torch.tensor(history.output, dtype=torch.long), minlength=vocab)[:vocab]  # [vocab]
    if cfg.repetition_penalty != 1.0:
        seen = counts > 0
        if history.prompt:
            seen[torch.tensor(history.prompt, dtype=torch.long)] = True
        scaled = torch.where(out > 0, out / cfg.repetition_penalty, out * cfg.repetition_penalty)
        out = torch.where(seen, scaled, out)
    counts = counts.to(out.dtype)
    return out - cfg.frequency_penalty * counts - cfg.presence_penalty * (counts > 0).to(out.dtype)


def apply_penalties(logits: torch.Tensor, configs: list[SamplingConfig],
                    histories: list[RowHistory | None]) -> torch.Tensor:
    """logits [rows, vocab_size] -> the rows whose config penalises, penalised (a copy if any):
    `penalize_row`'s arithmetic, bit for bit, on the (row, token) entries the histories name only,
    for every row at once."""
    assert logits.shape[0] == len(configs) == len(histories)
    rows = [i for i, c in enumerate(configs) if c.penalized]
    if not rows:
        return logits
    out = logits.float().clone()
    flat, vocab = out.view(-1), out.shape[1]  # [rows * vocab_size]
    outputs = _keys([(i, histories[i].output) for i in rows], vocab)
    prompts = _keys([(i, histories[i].prompt) for i in rows if configs[i].repetition_penalty != 1.0], vocab)
    seen, (emitted, counts) = torch.unique(torch.cat([outputs, prompts])), torch.unique(outputs, return_counts=True)
    rep = torch.tensor([c.repetition_penalty for c in configs], dtype=out.dtype)  # [rows]; 1.0: no change
    freq = torch.tensor([c.frequency_penalty for c in configs], dtype=out.dtype)
    pres = torch.tensor([c.presence_penalty for c in configs], dtype=out.dtype)
    v, r = flat[seen], rep[seen // vocab]
    flat[seen] = torch.where(v > 0, v / r, v * r)
    row = emitted // vocab
    flat[emitted] = flat[emitted] - freq[row] * counts.to(out.dtype) - pres[row]
    return out


def apply_min_tokens(logits: torch.Tensor, configs: list[SamplingConfig],
                     histories: list[RowHistory | None]) -> torch.Tensor:
    """logits [rows, vocab_size] -> the rows whose output is shorter than their min_tokens with the
    stop ids at -inf (a copy if any): the next token cannot end the output yet."""
    masked = [i for i, c in enumerate(configs) if c.min_tokens and c.stop_ids and len(histories[i].output) < c.min_tokens]
    if not masked:
        return logits
    out = logits.float().clone()
    for i in masked:
        out[i, list(configs[i].stop_ids)] = float("-inf")
    return out


def apply_bad_words(logits: torch.Tensor, configs: list[SamplingConfig],
                    histories: list[RowHistory | None]) -> torch.Tensor:
    """logits [rows, vocab_size] -> -inf at each bad word's last token where the row's output ends
    with the word's other tokens (always, for a one-token word); a copy if any."""
    banned = [(i, seq[-1]) for i, c in enumerate(configs) for seq in c.bad_words_ids
              if len(seq) == 1 or histories[i].output[len(histories[i].output) - len(seq) + 1:] == seq[:-1]]
    if not banned:
        return logits
    out = logits.float().clone()
    for i, token in banned:
        out[i, token] = float("-inf")
    return out


def _keys(pairs: list[tuple[int, tuple[int, ...]]], vocab: int) -> torch.Tensor:
    """(row, tokens) pairs -> [n] int64 flat indices row * vocab + token."""
    rows = [i for i, tokens in pairs for _ in tokens]
    tokens = [t for _, ts in pairs for t in ts]
    return torch.tensor(rows, dtype=torch.long) * vocab + torch.tensor(tokens, dtype=torch.long)


def row_histories(prompt_len: int, context: list[int], parents: list[int], draft_token_ids: list[int]
                  ) -> list[RowHistory]:
    """A step's rows of one sequence: row 0 after `context` (every committed token, prompt first),
    row 1 + i after node i of the proposal (a chain's or a tree's `parents`), its path included."""
    paths: list[tuple[int, ...]] = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (draft_token_ids[node],))
    prompt, output = tuple(context[:prompt_len]), tuple(context[prompt_len:])
    return [RowHistory(prompt, output)] + [RowHistory(prompt, output + path) for path in paths]
