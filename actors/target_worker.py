"""TargetWorker: owns the target model and its paged KV cache; verifies proposals."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from specray.actors.messages import SeqSpec, TargetItem
from specray.actors.specs import TargetSpec
from specray.actors.step_rows import (attach_features, attach_logprobs, attach_prompt_logprobs, last_kv_rows,
                                      num_logits, verification_rows)
from specray.kernels import row_costs
from specray.kernels.batch import RaggedBatch, SeqChunk, pad_uniform
from specray.kernels.loader import DTYPES, cache_root, load_model, resolve
from specray.kernels.model import LlamaModel
from specray.kernels.penalties import PathHistory, SeqHistory
from specray.kernels.proposal import VerifyResult
from specray.kernels.sampling import make_generator
from specray.kernels.tensor_parallel import check_shardable, init_distributed, shard_model
from specray.kernels.verify.batch import verify_batch
from specray.kernels.verify.rules import check_rule, pick_rule


@dataclass
class _TargetSeq:
    spec: SeqSpec
    generator: torch.Generator | None
    # every cached token, prompt first: what the sampling penalises and prefix caching names; None
    # where neither reads them
    tokens: list[int] | None = None
    matching: bool = False  # its prompt may still be found in the prefix cache (every block so far was)
    history: SeqHistory | None = None  # what penalties read, kept across steps (sampling that reads it only)


class _Before(NamedTuple):
    """A sequence before a step, what a failed step gives back: its blocks, digests and cached
    length, its tokens (None where the worker keeps none) and whether it was matching the prefix cache."""

    blocks: int
    digests: int
    cached: int
    tokens: int | None
    matching: bool


def auto_threads(tp_size: int) -> int:
    """The node's cores split among the target's ranks. Ray pins OMP_NUM_THREADS to an actor's
    num_cpus (1 by default), which would leave a CPU target running on one core."""
    return max(1, len(os.sched_getaffinity(0)) // tp_size)


class TargetWorker:
    """Plain class; Ray places it in cluster/. Usable in-process."""

    def __init__(self, model: LlamaModel, num_blocks: int = 2048, block_size: int = 16,
                 cost_key: tuple | None = None, prefix_caching: bool = False):
        self.model = model
        # what identifies this step's costs on a machine (model, kernels, dtype, device, TP size);
        # None: measure them afresh, never cached
        self.cost_key = cost_key
        self._row_costs: row_costs.RowCosts | None = None
        self.cache = model.make_cache(num_blocks, block_size, prefix_caching)
        self.seqs: dict[object, _TargetSeq] = {}
        self.pad_batches = False  # benchmark baseline: pad inputs and keys to the batch's longest
        self.busy_seconds = 0.0  # wall time inside step(): benchmarks split a round's time with it

    @classmethod
    def from_spec(cls, spec: TargetSpec) -> "TargetWorker":
        """Build inside the worker's process. With tp_size > 1 this joins the process group and
        blocks until every rank has: create all ranks before waiting on any."""
        torch.set_num_threads(spec.threads or auto_threads(spec.tp_size))
        model = load_model(resolve(spec.model), DTYPES[spec.dtype], spec.device, kernels=spec.kernels)
        if spec.tp_size > 1:
            check_shardable(model.config, spec.tp_size)  # fail on every rank before the rendezvous
            device = torch.device(spec.device)
            if device.type == "cuda" and device.index is not None:
                torch.cuda.set_device(device)  # NCCL talks from the current device
            group = init_distributed(spec.tp_rank, spec.tp_size, spec.dist_init_method, spec.dist_backend,
                                     spec.device)
            shard_model(model, group)
        return cls(model, spec.num_blocks, spec.block_size,
                   cost_key=(str(resolve(spec.model).path), model.kernel_mode, spec.dtype, spec.device, spec.tp_size),
                   prefix_caching=spec.enable_prefix_caching)

    def ping(self) -> bool:
        return True

    def busy(self) -> float:
        return self.busy_seconds

    def row_costs(self, measure: bool = False) -> tuple[float, ...]:
        """Seconds of a forward step by rows, 1..row_costs.ROWS (kernels/row_costs.py): measured on
        this machine at the first call, and cached per machine where `cost_key` names the setup.
        `measure`: measure now, cached or not (tensor-parallel ranks measure together or not at all:
        a rank's steps wait for the others' collectives)."""
        if self._row_costs is None or measure:
            measure_now = functools.partial(row_costs.measure, self.model, self.cache)
            self._row_costs = measure_now() if self.cost_key is None else row_costs.cached_costs(
                row_costs.cache_key(*self.cost_key), measure_now, cache_root(), fresh=measure)
        return self._row_costs.seconds

    def stored_row_costs(self) -> tuple[float, ...] | None:
        """This node's cached costs for the setup, without measuring; None where there are none."""
        if self._row_costs is None and self.cost_key is not None:
            self._row_costs = row_costs.stored_costs(row_costs.cache_key(*self.cost_key), cache_root())
        return None if self._row_costs is None else self._row_costs.seconds

    def tp_info(self) -> tuple[int, int]:
        """(tensor-parallel rank, size) of this worker; (0, 1) without TP."""
        return self.model.tp_group.rank, self.model.tp_group.size

    def step(self, items: list[TargetItem]) -> list[VerifyResult]:
        """Run prefill and verification for every item in one ragged forward pass.

        Trees ride in the same pass (tree mask, RoPE position = depth); afterwards the accepted
        path's KV is compacted into place and the rest of the tree's slots are dropped.
        Tensor-parallel ranks all get the same call: their gathered logits and seeded generators are
        the same, so each returns the same results and keeps its KV shard in step.
        """
        start = time.perf_counter()
        try:
            return self._step(items)
        finally:
            self.busy_seconds += time.perf_counter() - start

    def _step(self, items: list[TargetItem]) -> list[VerifyResult]:
        for item in items:
            if item.spec is not None:
                self.seqs[item.seq_id] = self._new_seq(item.spec)
                if item.spec.cache_salt is not None:
                    self.cache.salt(item.seq_id, item.spec.cache_salt)
        seeded = [s.generator for s in (self.seqs[i.seq_id] for i in items) if s.generator is not None]
        states = [g.get_state() for g in seeded]
        before = {i.seq_id: self._state(i.seq_id) for i in items}  # what a failed step gives back
        stats = replace(self.cache.pool.stats)
        hits = [self._match_prefix(item) for item in items]
        live = [item if hit == 0 else replace(item, new_token_ids=item.new_token_ids[hit:])
                for item, hit in zip(items, hits) if hit < len(item.new_token_ids)]
        try:
            rules = [self._rule(i) for i in live]  # validated before any KV is written
            chunks = [self._chunk(i) for i in live]
            results = self._results(live, rules, chunks) if live else []
            self._keep_features(live, chunks, results)  # before the commit: a failure here commits nothing
        except Exception:
            # Nothing was committed: the router retries the round without the request that broke
            # it, and seeded sequences draw again exactly what they drew this time.
            for generator, state in zip(seeded, states):
                generator.set_state(state)
            self._restore(before)
            self.cache.pool.stats = stats
            raise
        self._commit(live, chunks, results)
        computed = iter(results)
        results = [next(computed) if hit < len(item.new_token_ids) else VerifyResult.prompt_chunk()
                   for item, hit in zip(items, hits)]
        for item, hit, res in zip(items, hits, results):
            res.num_cached_tokens = hit
            if item.spec is not None and before[item.seq_id].matching:  # its whole prompt was looked up
                res.num_queried_tokens = item.spec.prompt_len
            seq = self.seqs[item.seq_id]
            if hit and seq.spec.features:
                self._prepend_cached_features(item.seq_id, seq.spec.features, before[item.seq_id].cached, hit, res)
            if seq.tokens is not None:
                self.cache.register_blocks(item.seq_id, seq.tokens, with_features=seq.spec.features == "hidden")
        return results

    def _new_seq(self, spec: SeqSpec) -> _TargetSeq:
        caching = self.cache.prefix_caching
        # prompt logprobs are rows of every prompt token, which a hit never computes (features are kept)
        matching = caching and not self.pad_batches and spec.prompt_logprobs is None
        tokens = [] if caching or spec.sampling.reads_history else None
        history = SeqHistory(spec.prompt_len, tokens) if spec.sampling.reads_history else None
        return _TargetSeq(spec, make_generator(spec.seed), tokens, matching, history)

    def _match_prefix(self, item: TargetItem) -> int:
        """How many of the item's new tokens (and of the prompt's rest) the prefix cache held, their KV
        now the sequence's: whole blocks of its prompt, never the last prompt token, whose logits
        draw the first token."""
        seq = self.seqs[item.seq_id]
        if not seq.matching:
            return 0
        before = len(seq.tokens)
        known = seq.tokens + item.new_token_ids + (item.prompt_rest or [])
        # the prompt's last token is the item's last, or the rest's
        hit = self.cache.match_prefix(item.seq_id, known, len(known) - (item.emits or item.prompt_rest is not None),
                                      with_features=seq.spec.features == "hidden")
        seq.tokens += known[before:before + hit]
        seq.matching = not item.emits and item.prompt_rest is None and hit == len(item.new_token_ids)
        return hit

    def _state(self, seq_id: object) -> _Before:
        table, seq = self.cache.tables.get(seq_id), self.seqs[seq_id]
        blocks = (len(table.blocks), len(table.digests), table.num_cached) if table is not None else (0, 0, 0)
        return _Before(*blocks, None if seq.tokens is None else len(seq.tokens), seq.matching)

    def _restore(self, before: dict[object, _Before]) -> None:
        """A failed step leaves each sequence as it found it (its prefix hits and the blocks reserved
        for it given back): the router retries the same items."""
        for seq_id, b in before.items():
            self.cache.restore(seq_id, b.blocks, b.digests, b.cached)
            seq = self.seqs[seq_id]
            if b.tokens is not None:
                del seq.tokens[b.tokens:]
            seq.matching = b.matching

    def _results(self, items: list[TargetItem], rules: list[str], chunks: list[SeqChunk]) -> list[VerifyResult]:
        """Forward, verification, features and logprobs: everything but the KV commit."""
        trees = any(c.parents is not None for c in chunks)
        laid_out = pad_uniform(chunks) if self.pad_batches and len(chunks) > 1 and not trees else chunks
        wants = [self.seqs[i.seq_id].spec.features for i in items]
        if any(wants) and laid_out is not chunks:
            raise ValueError("the padded baseline does not return target features")
        batch = RaggedBatch.build(laid_out, self.cache, self.model.embed_tokens.device)
        hidden = "hidden" in wants
        out = self.model(batch, self.cache, features=hidden)
        logits = out[0] if hidden else out
        results = self._verify(items, rules, verification_rows(items, logits))  # [sum(n + 1), vocab_size]
        if any(wants):
            features = {"hidden": out[1] if hidden else None,
                        "last_kv": last_kv_rows(self.cache, batch.slot_mapping, self.model.tp_group.size)
                        if "last_kv" in wants else None}
            attach_features(items, results, wants, features)
        specs = [self.seqs[i.seq_id].spec for i in items]
        attach_logprobs(items, logits, results, [spec.logprobs for spec in specs])
        attach_prompt_logprobs(items, logits, results, [spec.prompt_logprobs for spec in specs])
        return results

    def _keep_features(self, items: list[TargetItem], chunks: list[SeqChunk], results: list[VerifyResult]) -> None:
        """With prefix caching, each committed token's final hidden state stays in its slot beside its
        KV, for a later sequence that takes the block (LongSpec's last-layer KV is the KV itself).
        Written at the positions the commit gives them (a tree's accepted path moves into place)."""
        if not self.cache.prefix_caching:
            return
        for item, chunk, res in zip(items, chunks, results, strict=True):
            if self.seqs[item.seq_id].spec.features == "hidden":
                self.cache.write_features(item.seq_id, chunk.context_len, res.features)  # [committed, hidden]

    def _prepend_cached_features(self, seq_id: object, kind: str, start: int, hit: int, res: VerifyResult) -> None:
        """The features of the `hit` tokens from `start` the prefix cache held, before those computed."""
        cached = (self.cache.read_features(seq_id, start, start + hit) if kind == "hidden" else  # [hit, width]
                  last_kv_rows(self.cache, self.cache.slots(seq_id, start, start + hit), self.model.tp_group.size))
        res.features = cached if res.features is None else torch.cat([cached, res.features])

    def _commit(self, items: list[TargetItem], chunks: list[SeqChunk], results: list[VerifyResult]) -> None:
        """Each sequence's accepted KV becomes its cached prefix; a tree's other slots are dropped."""
        for item, chunk, res in zip(items, chunks, results, strict=True):
            base = chunk.context_len + len(item.new_token_ids)
            if res.accepted_nodes is not None:
                self.cache.compact(item.seq_id, base, [base + node for node in res.accepted_nodes])
            self.cache.set_cached(item.seq_id, base + res.num_accepted)
            tokens = self.seqs[item.seq_id].tokens
            if tokens is not None:
                tokens += item.new_token_ids + res.accepted_token_ids
            if chunk.parents is not None:  # the rejected branches' blocks go back to the pool
                self.cache.release_unused(item.seq_id)

    def _rule(self, item: TargetItem) -> str:
        """The router's rule for this item (or the one its kind needs), checked before any KV is written."""
        greedy = self.seqs[item.seq_id].spec.sampling.greedy
        rule = item.rule or pick_rule(item.proposal, greedy)
        check_rule(rule, item.proposal, greedy)
        return rule

    def _chunk(self, item: TargetItem) -> SeqChunk:
        """New committed tokens (a chain), then the draft tokens: a chain or a tree under the pending token."""
        proposal, m = item.proposal, len(item.new_token_ids)
        parents = None
        if proposal.is_tree:
            parents = list(range(-1, m - 1)) + [m - 1 if p < 0 else m + p for p in proposal.tree_parents()]
        return SeqChunk(item.seq_id, item.new_token_ids + proposal.draft_token_ids,
                        self.cache.num_cached(item.seq_id), parents, num_logits=num_logits(item))

    def _verify(self, items: list[TargetItem], rules: list[str], logits: torch.Tensor) -> list[VerifyResult]:
        """logits [sum of the emitting items' n + 1, vocab_size] -> a result per item; a prompt chunk
        before the prompt's last has no logits and draws nothing."""
        emitting = [(item, rule) for item, rule in zip(items, rules, strict=True) if item.emits]
        seqs = [self.seqs[item.seq_id] for item, _ in emitting]
        histories = [self._histories(item) for item, _ in emitting]
        verified = iter(verify_batch(logits, [item.proposal for item, _ in emitting], [rule for _, rule in emitting],
                                     [s.spec.sampling for s in seqs], [s.generator for s in seqs], histories)
                        if emitting else ())
        return [next(verified) if item.emits else VerifyResult.prompt_chunk() for item in items]

    def _histories(self, item: TargetItem) -> list[PathHistory] | None:
        """What penalties read before each of the item's rows; None where its sampling has none."""
        history = self.seqs[item.seq_id].history
        if history is None:
            return None
        p = item.proposal
        return history.rows(item.new_token_ids, p.tree_parents(), p.draft_token_ids)

    def release(self, seq_id: object) -> None:
        self.seqs.pop(seq_id, None)
        self.cache.free(seq_id)
