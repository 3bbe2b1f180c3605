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
    """The tokens before a row's position: the prompt's, then the output's (drafts on its path
    included). The reference form; `PathHistory` answers the same questions without copying them."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def output_len(self) -> int:
        return len(self.output)

    def output_tail(self, n: int) -> tuple[int, ...]:
        """The output's last n tokens (fewer if it is shorter)."""
        return self.output[max(0, len(self.output) - n):] if n > 0 else ()

    def output_counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (the output's distinct tokens [u], how often each occurs [u])."""
        return torch.unique(torch.tensor(self.output, dtype=torch.long), return_counts=True)

    def prompt_ids(self) -> torch.Tensor:
        """The prompt's distinct tokens [p]."""
        return torch.unique(torch.tensor(self.prompt, dtype=torch.long))


class SeqHistory:
    """One sequence's committed tokens, kept across steps: `tokens` is the worker's own list (it only
    grows, in place), and the output's token counts follow it incrementally, so a step's rows cost
    what their drafts add, not the sequence's length."""

    def __init__(self, prompt_len: int, tokens: list[int]):
        self.prompt_len, self.tokens = prompt_len, tokens
        self._prompt: torch.Tensor | None = None
        self.slot: dict[int, int] = {}  # token -> its place in _ids and _counts
        self._ids = torch.zeros(16, dtype=torch.long)  # [capacity] distinct output tokens, first seen first
        self._counts = torch.zeros(16, dtype=torch.long)  # [capacity]
        self._counted = self.prompt_len  # output tokens counted: tokens[prompt_len:_counted]

    def rows(self, new_token_ids: list[int], parents: list[int], draft_token_ids: list[int]) -> list["PathHistory"]:
        """What `row_histories` gives for context tokens + new_token_ids, without copying the tokens."""
        pending = tuple(new_token_ids)
        return [PathHistory(self, pending + path) for path in draft_paths(parents, draft_token_ids)]

    def counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed output's (distinct tokens [u], counts [u]): views, valid until the next commit."""
        # a failed step takes back only the prompt tokens it found in the prefix cache: never counted output
        assert not self.prompt_len < self._counted > len(self.tokens), "a committed output token was taken back"
        for t in self.tokens[self._counted:]:
            self._count(t)
        self._counted = max(self._counted, len(self.tokens))
        u = len(self.slot)
        return self._ids[:u], self._counts[:u]

    def _count(self, token: int) -> None:
        i = self.slot.get(token)
        if i is None:
            i = self.slot[token] = len(self.slot)
            if i == self._ids.shape[0]:  # full: double the room
                self._ids = torch.cat([self._ids, torch.zeros_like(self._ids)])
                self._counts = torch.cat([self._counts, torch.zeros_like(self._counts)])
            self._ids[i] = token
        self._counts[i] += 1

    def prompt_ids(self, extra: tuple[int, ...]) -> torch.Tensor:
        if self._prompt is not None:
            return self._prompt
        prompt = (self.tokens + list(extra))[:self.prompt_len]
        ids = torch.unique(torch.tensor(prompt, dtype=torch.long))
        if len(self.tokens) >= self.prompt_len:  # whole: it never changes again
            self._prompt = ids
        return ids


@dataclass(frozen=True)
class PathHistory:
    """A row's history as a sequence's committed tokens (`base`) and the tokens after them on the
    row's path (`extra`: the step's new committed tokens, then the drafts before the row)."""

    base: SeqHistory
    extra: tuple[int, ...]

    @property
    def output_len(self) -> int:
        return max(0, len(self.base.tokens) + len(self.extra) - self.base.prompt_len)

    def output_tail(self, n: int) -> tuple[int, ...]:
        n = max(0, min(n, self.output_len))
        from_extra = min(n, len(self.extra))
        tail = self.extra[len(self.extra) - from_extra:] if from_extra else ()
        tokens = self.base.tokens
        return tuple(tokens[len(tokens) - (n - from_extra):]) + tail if n > from_extra else tail

    def output_counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids, counts = self.base.counts()
        skip = max(0, self.base.prompt_len - len(self.base.tokens))  # extra tokens still in the prompt
        added = self.extra[skip:]
        if not added:
            return ids, counts
        counts, new = counts.clone(), {}
        for t in added:  # the row's few tokens after the committed ones
            i = self.base.slot.get(t)
            if i is None:
                new[t] = new.get(t, 0) + 1
            else:
                counts[i] += 1
        if not new:
            return ids, counts
        return (torch.cat([ids, torch.tensor(list(new), dtype=torch.long)]),
                torch.cat([counts, torch.tensor(list(new.values()), dtype=torch.long)]))

    def prompt_ids(self) -> torch.Tensor:
        return self.base.prompt_ids(self.extra)


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
    emitted_parts, count_parts, seen_parts = [], [], []
    for i in rows:
        ids, counts = histories[i].output_counts()  # [u] distinct output tokens, [u] their counts
        emitted_parts.append(ids + i * vocab)
        count_parts.append(counts)
        seen = ids if configs[i].repetition_penalty == 1.0 else torch.cat([ids, histories[i].prompt_ids()])
        seen_parts.append(seen + i * vocab)
    # a row's prompt and output may name a token twice in `seen`: both writes are of the same value
    seen, emitted, counts = torch.cat(seen_parts), torch.cat(emitted_parts), torch.cat(count_parts)
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
    masked = [i for i, c in enumerate(configs) if c.min_tokens and c.stop_ids and histories[i].output_len < c.min_tokens]
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
              if len(seq) == 1 or histories[i].output_tail(len(seq) - 1) == tuple(seq[:-1])]
    if not banned:
        return logits
    out = logits.float().clone()
    for i, token in banned:
        out[i, token] = float("-inf")
    return out


def row_histories(prompt_len: int, context: list[int], parents: list[int], draft_token_ids: list[int]
                  ) -> list[RowHistory]:
    """The reference for `SeqHistory.rows`: a step's rows of one sequence, row 0 after `context`
    (every committed token, prompt first), row 1 + i after node i of the proposal (a chain's or a
    tree's `parents`), its path included."""
    prompt, output = tuple(context[:prompt_len]), tuple(context[prompt_len:])
    return [RowHistory(prompt, output + path) for path in draft_paths(parents, draft_token_ids)]


def draft_paths(parents: list[int], draft_token_ids: list[int]) -> list[tuple[int, ...]]:
    """The draft tokens before each row of a step: () for row 0, then node i's path to the root
    (a chain's or a tree's `parents`), node i included, for row 1 + i."""
    paths: list[tuple[int, ...]] = [()]
    for node, parent in enumerate(parents):
        paths.append(paths[parent + 1] + (draft_token_ids[node],))
    return paths
