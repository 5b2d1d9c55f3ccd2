"""One model with its own paged KV cache and block pool: turns ragged token chunks into forwards.

Decode-shaped forwards (T tokens per row, T in the runner's `decode_tokens`) can be replayed from captured
graphs (engine/model/captured.py: torch.compile on CPU, CUDA graphs on GPU); everything else, prefill
above all, runs eagerly. Both paths compute the same function; tests compare them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from pcgtts.engine.attention import (
    AttentionBackend,
    PagedBatch,
    TreeLayout,
    build_paged_batch,
    cache_slots,
    pad_query_rows,
)
from pcgtts.engine.batch_invariance import PLAIN, InvariancePlan
from pcgtts.engine.block_manager import BlockAllocator, SeqBlocks
from pcgtts.engine.kv_cache import KVCache
from pcgtts.engine.kv_mirror import KVMirror
from pcgtts.engine.model.captured import CapturedForward, make_captured, resolve_mode
from pcgtts.engine.model.llama import LlamaModel
from pcgtts.engine.model.loader import few_op_forms


def attends_by_rows(requested: bool, device: torch.device, backend: AttentionBackend,
                    dtype: torch.dtype) -> bool:
    """Whether a runner's eager forwards attend each row over its own keys (engine/ops/row_attention.py):
    asked for (the engine's compiled CPU ops), on a CPU, float32, over the gather backend. The one test the
    engine (for the K/V store's dtype) and each runner (for its forwards) apply."""
    return requested and device.type == "cpu" and backend.name == "sdpa" and dtype == torch.float32


def kv_store_dtype(cpu_kv: str, rows: bool, device: torch.device, dtype: torch.dtype,
                   compiled: bool) -> torch.dtype:
    """The K/V pool's (and mirror's) dtype: fp16 when asked (EngineConfig.cpu_kv) and every attention over it
    widens as it reads, the rows' own attention (`rows`) or a prefill's SDPA over gathered blocks, in eager
    op-by-op CPU forwards (loader.few_op_forms); captured graphs and other devices keep the model's dtype."""
    return torch.float16 if cpu_kv == "fp16" and rows and few_op_forms(device, dtype, compiled) else dtype


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, backend: AttentionBackend,
                 decode_graphs: str = "eager", decode_tokens: tuple[int, ...] = (),
                 cache_dir: Path | None = None, kv_mirror_bytes: int = 0, row_attention: bool = False,
                 tree_tokens: int = 0, kv_dtype: torch.dtype | None = None):
        """decode_graphs: "eager" | "compile" | "cuda_graphs" | "auto" (captured.resolve_mode);
        decode_tokens: the tokens-per-row counts to capture (e.g. (γ+1,) for a target);
        kv_mirror_bytes: memory bound of the KV mirror (0: none), used by eager CPU forwards with the
        gather backend only; row_attention: eager CPU float32 forwards with the gather backend may attend
        each row over its own keys (engine/ops/row_attention.py; the engine's compiled ops); tree_tokens:
        the tokens per row of a token tree's verify forward (eager), which decodes like decode_tokens;
        kv_dtype: the KV cache's (and mirror's) dtype, the model's by default (fp16 under a float32 model:
        K/V rounded as they are written, EngineConfig.cpu_kv)."""
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.blocks = BlockAllocator(num_blocks, block_size)
        self.kv_dtype = kv_dtype or model.dtype
        self.cache = KVCache(model.cfg, num_blocks, block_size, model.device, self.kv_dtype)
        self.backend = backend
        # an additive attention mask where the CPU attention kernel would otherwise convert a bool one
        self.mask_dtype = model.dtype if self.device.type == "cpu" and backend.name == "sdpa" else torch.bool
        self.decode_graphs = resolve_mode(decode_graphs, self.device)
        self.captured: CapturedForward | None = None
        if decode_tokens:
            self.captured = make_captured(self.decode_graphs, self._forward, decode_tokens,
                                          self.cache.scratch_block, self.device, num_blocks, cache_dir)
        self.plan = PLAIN
        # eager CPU forwards run their products over real tokens only (`forward`); False: over padding too
        # (the form before, which bench/results/ragged-verify/ab_ragged.py times against)
        self.pack_padding = True
        self.row_attention = attends_by_rows(row_attention, self.device, backend, model.dtype)
        self.mirror: KVMirror | None = None
        # prefill chunks bypass the mirror (pool only): it holds decoding rows, each gathered from the pool
        # at its first decode forward
        self.mirror_max_tokens = max(*decode_tokens, tree_tokens, 1)
        if kv_mirror_bytes and self.captured is None and backend.name == "sdpa" and self.device.type == "cpu":
            cfg = model.cfg
            self.mirror = KVMirror(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, block_size, self.device,
                                   self.kv_dtype, kv_mirror_bytes)

    def apply_plan(self, plan: InvariancePlan) -> None:
        """Shape this runner's forwards by `plan` (engine/batch_invariance.py): padded GEMM rows, attention
        queries and contexts, and one RMSNorm form, so each row computes the same bits whatever shares it."""
        if plan.key_tile % self.block_size or plan.min_keys % self.block_size:
            raise ValueError(f"key blocks of {plan.key_tile} and {plan.min_keys} are not whole "
                             f"{self.block_size}-token KV blocks")
        self.plan = plan
        self.model.apply_plan(plan)

    def block_tables(self, states: list[SeqBlocks], num_tokens: int) -> torch.Tensor:
        """Long[B, M] block tables covering positions [0, num_tokens) (and up to the plan's context for
        them), padded with the scratch block."""
        cols = self.blocks.blocks_for(self.plan.context(self.blocks.blocks_for(num_tokens) * self.block_size))
        scratch = self.cache.scratch_block
        rows = [st.blocks[:cols] + [scratch] * (cols - min(cols, len(st.blocks))) for st in states]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                 tables: torch.Tensor) -> torch.Tensor:
        """The whole forward from tensors only (what graphs capture)."""
        meta = build_paged_batch(positions, valid, tables, self.block_size, self.cache.scratch_block,
                                 self.mask_dtype, self.plan.query_quantum)
        return self.model.hidden_states(input_ids, meta, self.cache, self.backend)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                tables: torch.Tensor, eager: bool = False, meta: PagedBatch | None = None,
                states: list[SeqBlocks] | None = None, tree: TreeLayout | None = None) -> torch.Tensor:
        """Long[B, T] tokens at Long[B, T] positions (Bool[B, T] valid) -> hidden [B, T, d]; writes K/V.
        eager: bypass captured graphs (equivalence tests); meta: the eager forward's attention metadata
        when the caller has it already (`column_metas`); states: the rows' sequences (lets the KV mirror
        serve attention; without them the forward gathers from the pool); tree: a token tree's cache
        indices and gaps (engine/attention.py TreeLayout; always eager). Eager CPU forwards run their matrix
        products over the valid tokens only (`pack_padding`); padding tokens' hidden states are zeros."""
        if (not eager and tree is None and self.captured is not None
                and self.captured.handles(input_ids.shape[1])):
            return self.captured(input_ids, positions, valid, tables)
        with torch.inference_mode():
            if meta is None:
                meta = build_paged_batch(positions, valid, tables, self.block_size,
                                         self.cache.scratch_block, self.mask_dtype, self.plan.query_quantum,
                                         self.rows_attend(input_ids.shape[1]), tree)
            if (self.pack_padding and meta.packed is None and self.device.type == "cpu"
                    and not bool(valid.all())):
                # padding tokens (rows verifying fewer drafts, shorter prefill chunks) skip the products:
                # on a CPU those cost per token (on CUDA a few more rows cost about nothing, and finding
                # the real ones would wait for the device)
                meta = replace(meta, packed=valid.reshape(-1).nonzero().squeeze(1))
            if self.mirror is not None and states is None:
                self.mirror.clear()  # this forward writes the pool around the mirror: start it afresh
            elif self.mirror is not None and input_ids.shape[1] > self.mirror_max_tokens:
                self.mirror.forget(states)  # written around the mirror: gathered again when they decode
            elif self.mirror is not None:
                index = positions if tree is None else tree.cache_index  # where the K/V goes
                mirrored = self.mirror.prepare(states, index.tolist(), valid.tolist(), tables, meta.mask,
                                               self.cache.keys, self.cache.values)
                if mirrored is not None:
                    meta = replace(meta, mirror=mirrored)
            return self.model.hidden_states(input_ids, meta, self.cache, self.backend)

    def rows_attend(self, tokens_per_row: int) -> bool:
        """Whether a forward of this many tokens per row attends each row over its own keys
        (engine/ops/row_attention.py): decode and verify forwards, and under a batch-invariance plan every
        forward, so a position's K/V computed by a prefill (a preempted or prefix-shared row) is the same
        bits as by decode steps. Prefill chunks without a plan keep SDPA, whose matrix products take long
        query blocks faster than the row loop."""
        return self.row_attention and (self.plan.active or tokens_per_row <= self.mirror_max_tokens)

    def column_metas(self, positions: torch.Tensor, tables: torch.Tensor) -> list[PagedBatch] | None:
        """Attention metadata of J one-token forwards at the columns of Long[B, J] positions (all valid),
        built in one go: the draft's proposals of one step. None when those forwards replay captured graphs
        (which build their own)."""
        if self.captured is not None and self.captured.handles(1):
            return None
        b, j = positions.shape
        rows_attend = self.rows_attend(1)
        meta = build_paged_batch(positions, torch.ones_like(positions, dtype=torch.bool), tables,
                                 self.block_size, self.cache.scratch_block, self.mask_dtype,
                                 row_attention=rows_attend)
        slots = meta.slot_mapping.view(b, j)
        if rows_attend:
            return [replace(meta, positions=meta.positions[:, c:c + 1], slot_mapping=slots[:, c],
                            row_positions=meta.row_positions[:, c:c + 1]) for c in range(j)]
        # each one-token forward's mask: its column, then the padding queries' rows the plan asks for
        padding = pad_query_rows(meta.mask[:, :, :1], self.plan.query_quantum)[:, :, 1:]
        return [replace(meta, positions=meta.positions[:, c:c + 1], slot_mapping=slots[:, c],
                        mask=torch.cat([meta.mask[:, :, c:c + 1], padding], dim=2) if padding.shape[2]
                        else meta.mask[:, :, c:c + 1]) for c in range(j)]

    def warm_up(self, name: str) -> float:
        """Build the captured graphs now (start-up) rather than on the first request; seconds taken."""
        if self.captured is None:
            return 0.0
        return self.captured.warm_up(name, self.blocks.num_blocks)

    def forward_chunks(self, states: list[SeqBlocks], chunks: list[list[int]]) -> torch.Tensor:
        """Feed each row its token chunk at positions num_computed.. (rows left-padded to the longest, so
        every row's last token sits at index T-1, where causal paged kernels align queries).

        Advances num_computed; returns hidden [B, T, d]. Room must have been reserved."""
        width = max(len(c) for c in chunks)
        ids = [[0] * (width - len(c)) + c for c in chunks]
        starts = torch.tensor([st.num_computed for st in states], device=self.device)
        pad = torch.tensor([width - len(c) for c in chunks], device=self.device)
        offsets = torch.arange(width, device=self.device)
        positions = starts[:, None] + offsets[None, :] - pad[:, None]  # [B, T]
        valid = offsets[None, :] >= pad[:, None]
        end = max(st.num_computed + len(c) for st, c in zip(states, chunks, strict=True))
        tables = self.block_tables(states, end)
        hidden = self.forward(torch.tensor(ids, device=self.device), positions, valid, tables, states=states)
        for st, c in zip(states, chunks, strict=True):
            st.num_computed += len(c)
        return hidden

    @torch.inference_mode()
    def move_kv(self, state: SeqBlocks, src: int, dst: int, count: int) -> None:
        """Copy the K/V of cache indices [src, src + count) to [dst, dst + count) in the pool and, where the
        row holds them, in the KV mirror: a token tree's accepted branch moved to where a chain's would
        be (engine/spec_tree.py). dst < src; both ranges inside the row's blocks."""
        if count <= 0 or src == dst:
            return
        table = torch.tensor([state.blocks], dtype=torch.long, device=self.device)  # [1, M]
        index = torch.arange(count, device=self.device)[None, :]  # [1, count]
        src_slots, dst_slots = (cache_slots(table, i, self.block_size)[0] for i in (src + index, dst + index))
        for t in self.cache.tensors():
            t[dst_slots] = t[src_slots]
        if self.mirror is not None:
            self.mirror.move(state, src, dst, count)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)
