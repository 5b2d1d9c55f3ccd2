"""Decode forwards captured once and replayed: `torch.compile` (inductor) on CPU, CUDA graphs on GPU.

A decode step runs the same few shapes over and over: the target on γ+1 tokens per row (1 without a
draft), the draft on 1 token per row (2 when it catches up after a fully accepted round). For a model as
small as the embedded one, half of an eager forward is Python dispatch and separate passes over small
tensors (RMSNorm, RoPE, SiLU, residuals); a captured graph fuses those and skips the dispatch.

Both capture the same function, `forward(ids, positions, valid, tables, *kv) -> hidden`, which builds the
paged-attention metadata and runs the model with tensor ops only, so all that varies between calls is
tensor *contents* plus three sizes: rows B, tokens per row T and block-table width M (the longest row's
context in blocks).

- `CompiledForward` (CPU): one inductor graph per T, dynamic in B and M (B = 1 gets its own graph: size 1
  is always specialised). M is padded to at least 2 blocks with the scratch block, so short contexts never
  trigger a compile at run time. Compiled code is cached on disk (inductor's FX graph cache, in
  `cache_dir`), so a restart re-traces but does not re-compile C++.
- `CudaGraphForward` (GPU): static buffers per (B bucket, T, M bucket); rows are padded with invalid
  tokens (written to the scratch block, masked from every real row) and tables with the scratch block.
  Graphs are captured lazily on first use (milliseconds each) into one shared memory pool.

Padding never changes a real row's result: padded query rows are separate batch rows, and padded table
columns are masked (key position > query position).
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger("pcgtts.engine")

# (ids Long[B, T], positions Long[B, T], valid Bool[B, T], tables Long[B, M]) -> hidden [B, T, d]
ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

MODES = ("eager", "compile", "cuda_graphs", "auto")


# inductor writes its own default into the environment on first use; remember what the user set
_USER_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def default_cache_dir() -> Path:
    """Where compiled decode graphs persist between runs: $XDG_CACHE_HOME/pcgtts/inductor."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pcgtts" / "inductor"


def resolve_mode(mode: str, device: torch.device) -> str:
    """`auto`: CUDA graphs on CUDA, eager on CPU (compiling takes minutes on a small CPU; see README)."""
    if mode not in MODES:
        raise ValueError(f"unknown decode_graphs mode {mode!r}; choose from {', '.join(MODES)}")
    if mode == "auto":
        return "cuda_graphs" if device.type == "cuda" else "eager"
    if mode == "cuda_graphs" and device.type != "cuda":
        raise ValueError("decode_graphs='cuda_graphs' needs a CUDA device")
    return mode


def pad_table(tables: torch.Tensor, width: int, scratch_block: int) -> torch.Tensor:
    """Long[B, M] -> Long[B, width], extra columns pointing at the scratch block."""
    b, m = tables.shape
    if m >= width:
        return tables
    return torch.cat([tables, tables.new_full((b, width - m), scratch_block)], dim=1)


class CapturedForward(ABC):
    """A captured forward for a fixed set of tokens-per-row T; other T values run eagerly."""

    def __init__(self, fn: ForwardFn, token_counts: tuple[int, ...], scratch_block: int):
        self.fn = fn
        self.token_counts = tuple(sorted(set(token_counts)))
        self.scratch_block = scratch_block

    def handles(self, num_tokens: int) -> bool:
        return num_tokens in self.token_counts

    @abstractmethod
    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                 tables: torch.Tensor) -> torch.Tensor:
        """Same contract as the eager forward; only called for T in `token_counts`."""

    def warm_up(self, name: str, max_blocks: int) -> float:
        """Build every graph that run-time shapes need (so none is built while serving); seconds taken."""
        started = time.perf_counter()
        shapes = [(b, t) for t in self.token_counts for b in (1, 2)]
        for i, (b, t) in enumerate(shapes, 1):
            log.info("capturing %s decode graph %d/%d (rows %s, %d tokens each)", name, i, len(shapes),
                     "1" if b == 1 else ">1", t)
            ids = torch.zeros(b, t, dtype=torch.long, device=self._device)
            valid = torch.zeros(b, t, dtype=torch.bool, device=self._device)  # writes go to scratch only
            tables = torch.full((b, min(3, max_blocks)), self.scratch_block, dtype=torch.long,
                                device=self._device)
            self(ids, ids, valid, tables)
        return time.perf_counter() - started

    _device = torch.device("cpu")


class CompiledForward(CapturedForward):
    """inductor graphs (CPU), dynamic in rows and context."""

    MIN_BLOCKS = 2  # table width 1 would be specialised (a second graph); pad it to 2

    def __init__(self, fn: ForwardFn, token_counts: tuple[int, ...], scratch_block: int,
                 cache_dir: Path | None = None):
        super().__init__(fn, token_counts, scratch_block)
        import torch._dynamo
        import torch.fx.experimental._config as fx_config

        # B, M and T are independent sizes: "duck sizing" would tie equal ones together and recompile
        # later when they differ.
        fx_config.use_duck_shape = False
        # Only the sizes marked dynamic below vary. Target and draft run the same forward code with
        # weights of other shapes: with automatic dynamic shapes the second model's differing sizes (heads,
        # widths) would turn symbolic, giving slower code, and a head count compared to another symbolic
        # size would no longer be a plain bool (SDPA's enable_gqa refuses it). Each model gets its own
        # static graph instead.
        torch._dynamo.config.automatic_dynamic_shapes = False
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # inductor reads its cache location from the environment (process-wide): an explicit cache_dir
        # wins, then the user's TORCHINDUCTOR_CACHE_DIR, then ours
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir or _USER_CACHE_DIR or default_cache_dir())
        # one compiled callable per T, so that the graphs of one T never evict another's
        self._compiled = {t: torch.compile(fn, fullgraph=True) for t in self.token_counts}

    def __call__(self, ids, positions, valid, tables):
        # Captured code mutates the KV cache (ordinary tensors), which inference_mode refuses, so the graph
        # runs in no_grad instead (same numerics); its inputs are made ordinary tensors too, so that one
        # graph serves calls from inside and outside inference_mode.
        with torch.inference_mode(False), torch.no_grad():
            fresh = torch.contiguous_format
            ids, positions, valid = (x.clone(memory_format=fresh) for x in (ids, positions, valid))
            tables = pad_table(tables, self.MIN_BLOCKS, self.scratch_block).clone(memory_format=fresh)
            return self._run(ids, positions, valid, tables)

    def _run(self, ids, positions, valid, tables):
        # only B and M vary; weights and head sizes stay static (better code). B = 1 stays specialised.
        if ids.shape[0] > 1:
            for x in (ids, positions, valid, tables):
                torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(tables, 1)
        return self._compiled[ids.shape[1]](ids, positions, valid, tables)


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n (n itself beyond the largest)."""
    return next((b for b in buckets if b >= n), n)


class _Graph:
    """One captured CUDA graph with its static inputs and output."""

    def __init__(self, fn: ForwardFn, rows: int, tokens: int, blocks: int, scratch_block: int,
                 device: torch.device, pool):
        self.ids = torch.zeros(rows, tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, tokens, dtype=torch.long, device=device)
        self.valid = torch.zeros(rows, tokens, dtype=torch.bool, device=device)
        self.tables = torch.full((rows, blocks), scratch_block, dtype=torch.long, device=device)
        self.scratch_block = scratch_block
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up outside capture (allocator, kernel selection)
            for _ in range(2):
                fn(self.ids, self.positions, self.valid, self.tables)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn(self.ids, self.positions, self.valid, self.tables)

    def replay(self, ids, positions, valid, tables) -> torch.Tensor:
        b, t = ids.shape
        m = tables.shape[1]
        self.valid.zero_()  # padded rows: invalid tokens at position 0, tables all scratch
        self.positions.zero_()
        self.ids[:b] = ids
        self.positions[:b] = positions
        self.valid[:b] = valid
        self.tables.fill_(self.scratch_block)
        self.tables[:b, :m] = tables
        self.graph.replay()
        return self.out[:b].clone()  # the next replay overwrites `out`


class CudaGraphForward(CapturedForward):
    """CUDA graphs per (row bucket, T, table-width bucket), captured on first use."""

    ROW_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)

    def __init__(self, fn: ForwardFn, token_counts: tuple[int, ...], scratch_block: int,
                 device: torch.device, max_blocks: int):
        super().__init__(fn, token_counts, scratch_block)
        self._device = device
        self.max_blocks = max_blocks
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def _block_bucket(self, m: int) -> int:
        return min(1 << max(0, m - 1).bit_length(), self.max_blocks) if m <= self.max_blocks else m

    def __call__(self, ids, positions, valid, tables):
        b, t = ids.shape
        key = (bucket(b, self.ROW_BUCKETS), t, self._block_bucket(tables.shape[1]))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = _Graph(self.fn, *key, self.scratch_block, self._device, self.pool)
        return graph.replay(ids, positions, valid, tables)


def make_captured(mode: str, fn: ForwardFn, token_counts: tuple[int, ...], scratch_block: int,
                  device: torch.device, max_blocks: int, cache_dir: Path | None = None
                  ) -> CapturedForward | None:
    """The captured forward for a resolved mode ("eager": None)."""
    if mode == "compile":
        return CompiledForward(fn, token_counts, scratch_block, cache_dir)
    if mode == "cuda_graphs":
        return CudaGraphForward(fn, token_counts, scratch_block, device, max_blocks)
    return None
