"""Batch invariance: a row's numbers never depend on what else shares its forward.

A seed fixes a request's random draws, but its tokens also depend on the float rounding of every product
that computed its logits, and a rare token flips where those round differently. Measured on this engine's
CPU path (scripts in bench/batch_invariance.py), the arithmetic of one row changed with its batch mates in
these places only:

- GEMMs by row count: MKL's sgemm computes a row with a different kernel when the product has few rows
  (on the build machines: 1-3 rows against 4 or more; with MKL_CBWR=COMPATIBLE, multiples of 8 only), so a
  one-token forward of one sequence and the same token inside a batch of four rounded differently;
  fbgemm's fp16-weight GEMM (llama.Projection's half weights) runs rows in blocks of 6 on AVX2 and rounds
  a remainder of 1-2 rows by another kernel (multiples of 3 are alike). Within the invariant class every
  row of every product is the same bits whatever the row count, so inputs are padded with zero rows up to
  a multiple of `row_quantum`, measured at start-up (`calibrate`).
- oneDNN's bf16 product (llama.Projection's bf16 copies, `cpu_weights="bf16"`) by shape, row count and a
  row's place in the call: on the AMX build machine the bundle's 256-input products computed every row
  alike in any call of 1-128 rows, wherever it sat, while the 688-input one changed with the row's
  offset and the feature head's 512-input ones between 8 and 36 rows. So each projection's bf16 product is
  checked at start-up (`invariant_anywhere`, calls of up to 128 rows at every 5th offset); plans take it
  (`bf16_products`) for those that pass, in calls of at most 128 rows, and the checkpoint weights' product
  for the others.
- Attention by query and context length: torch's CPU attention kernel splits the keys into blocks of
  `KEY_TILE` and reduces each block with a GEMM whose depth is the block's length, and splits the queries
  into blocks whose last one may be short. So contexts are padded (masked keys) to a multiple of the key
  tile and each sequence's queries to a multiple of `query_quantum` (measured apart from the GEMMs');
  then a query's output is the same for one query or a prefill chunk of hundreds, a context of its own
  length or a batch mate's longer one. The rows' own attention (engine/ops/row_attention.py, the CPU
  default) is invariant by construction: engines that run it under a plan pad neither, and do not
  measure torch's kernel.
- RMSNorm's two forms: decode-sized inputs took a layer-norm form and prefill-sized ones `rms_norm`, which
  round differently, so K/V recomputed by a prefill (after preemption, or shared through the prefix cache)
  differed from the same positions computed by decode steps. Under a plan both take `rms_norm`; engines
  with the compiled CPU ops take one compiled loop for every input, invariant by construction
  (engine/ops/rms_norm.py).

What a faster kernel must preserve: for every op of the forward, a row's output is a function of that
row's inputs only (not of the row count, the query count per sequence, the padded context length or the
row's place in the batch), bit for bit. `tests/engine/test_batch_invariance.py` checks each op class and
whole forwards this way; the sampler, the verify rules and the codec have their own per-row tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# candidates, smallest (cheapest) first (3 and 12: fbgemm's fp16 GEMM on AVX2, alone and beside MKL's)
ROW_QUANTA = (1, 2, 3, 4, 8, 12, 16)
KEY_TILE = 512  # keys per block of torch's CPU attention kernel (its kv split for float32)
MIN_KEYS = (128, 256, 384, KEY_TILE)  # candidates for the shortest key block, smallest (cheapest) first
# row counts checked per candidate quantum: every multiple up to this many quanta, then prefill sizes
_DECODE_QUANTA = 16
_PREFILL_ROWS = (256, 1000)


@dataclass(frozen=True)
class InvariancePlan:
    """How forwards are padded so that each row's arithmetic is the same whatever shares it."""

    row_quantum: int = 1  # GEMM inputs padded to a multiple of this many rows
    query_quantum: int = 1  # each sequence's attention queries (torch's kernel) padded to a multiple of this
    key_tile: int = 0  # keys per block of the attention kernel (0: contexts are not padded)
    min_keys: int = 0  # contexts padded so that no key block is shorter than this
    # projections with a bf16 copy whose rows oneDNN keeps invariant (llama.Projection.bf16_invariant)
    # multiply through it at every row count, in calls of at most BF16_CALL_ROWS rows; False: every
    # projection takes the checkpoint weights' products
    bf16_products: bool = False

    @property
    def active(self) -> bool:
        return self.key_tile > 0

    def context(self, keys: int) -> int:
        """Keys an attention call over `keys` keys (a whole number of KV blocks) runs over: its last key
        block lengthened to `min_keys` (masked keys), within one tile. Any two such contexts give a query
        the same numbers: the blocks before its last key are whole tiles, blocks after it are masked out
        entirely, and the GEMM of its own block runs over at least `min_keys` keys, where MKL's blocking
        of the reduction no longer depends on its length (measured by `calibrate`)."""
        tail = keys % self.key_tile if self.key_tile else 0
        return keys + self.min_keys - tail if 0 < tail < self.min_keys else keys


PLAIN = InvariancePlan()  # no padding: the fastest shapes, rows not invariant


def pad_rows(x: torch.Tensor, quantum: int) -> torch.Tensor:
    """x [R, ...] with zero rows appended up to a multiple of `quantum` (x itself if none are needed)."""
    short = -x.shape[0] % quantum
    if not short:
        return x
    return torch.cat([x, x.new_zeros((short, *x.shape[1:]))])


def rows_invariant(fn, x: torch.Tensor, quantum: int) -> bool:
    """Whether fn ([R, ...] -> [R, ...], row by row) gives every row of x [N, ...] the same bits for every
    row count that is a multiple of `quantum` (the first 16 multiples, then a few up to N) as for the
    largest such count."""
    n = x.shape[0] - x.shape[0] % quantum
    counts = sorted({quantum * k for k in range(1, _DECODE_QUANTA + 1) if quantum * k < n}
                    | {r - r % quantum for r in _PREFILL_ROWS if quantum <= r < n})
    reference = fn(x[:n])
    return n > 0 and all(torch.equal(fn(x[:c]), reference[:c]) for c in counts)


def invariant_anywhere(fn, x: torch.Tensor, start_step: int = 5) -> bool:
    """Whether fn ([R, ...] -> [R, ...], row by row) gives each row of x [N, ...] the same bits in a call of
    any row count from 1 to N, at any place in it, as in the call over all N: every count, its rows taken
    from every `start_step`-th offset of x. For a kernel that picks its blocking by shape, row count and a
    row's place among the blocks (oneDNN's bf16 product: some shapes' rows change between 8 and 36 rows,
    others with their offset in the call, bench/results/bf16-seeded/)."""
    n = x.shape[0]
    reference = fn(x)
    return all(torch.equal(fn(x[start:start + count]), reference[start:start + count])
               for count in range(1, n) for start in range(0, n - count + 1, start_step))


def random_rows(rows: int, features: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Float [rows, features] of a fixed seed: inputs for `rows_invariant`."""
    gen = torch.Generator(device=device).manual_seed(0)
    return torch.randn(rows, features, generator=gen, device=device).to(dtype)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention of q [R, T', H, D] over keys/values [R, ctx, H_kv, D] (mask
    [R, 1, T', ctx], bool or additive) -> [R, H, T', D]: the one call the backend and `calibrate` make."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                          attn_mask=mask, enable_gqa=q.shape[2] != keys.shape[2])


def causal_mask(positions: torch.Tensor, ctx: int, dtype: torch.dtype,
                gaps: torch.Tensor | None = None) -> torch.Tensor:
    """positions Long[R, T] -> mask [R, 1, T, ctx]: key j visible iff j <= position and j is outside the
    query's gap [lo, hi) (gaps Long[R, T, 2]; None: none) (bool, or additive: 0 visible, -inf hidden, in a
    float dtype)."""
    keys = torch.arange(ctx, device=positions.device)[None, None, :]
    mask = keys <= positions[:, :, None]
    if gaps is not None:
        mask &= (keys < gaps[..., :1]) | (keys >= gaps[..., 1:])
    if dtype != torch.bool:
        mask = mask.to(dtype).log_()  # 1 -> 0, 0 -> -inf
    return mask.unsqueeze(1)


def attention_invariant(plan: InvariancePlan, num_heads: int, num_kv_heads: int, head_dim: int,
                        device: torch.device, dtype: torch.dtype, mask_dtype: torch.dtype) -> bool:
    """Whether `attend`, shaped by `plan`, gives each query the same bits for any query count and any
    context: decode-sized and prefill-sized query blocks ending in the first and the second key tile, each
    at the shortest context the plan allows and at a longer one, against each query attended alone."""
    gen = torch.Generator(device=device).manual_seed(1)
    longest = 3 * plan.key_tile
    shape = (1, longest, num_kv_heads, head_dim)
    keys, values = (torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(2))
    q_all = torch.randn(1, longest, num_heads, head_dim, generator=gen, device=device).to(dtype)

    def run(first: int, count: int, context: int) -> torch.Tensor:  # [count, H, D]: queries first..
        padded = -(-count // plan.query_quantum) * plan.query_quantum
        pos = torch.arange(first, first + padded, device=device)
        pos = torch.where(pos < first + count, pos, 0)[None]  # padding queries see key 0 only
        out = attend(q_all[:, pos[0]], keys[:, :context], values[:, :context],
                     causal_mask(pos, context, mask_dtype))
        return out[0, :, :count].transpose(0, 1)

    tile = plan.key_tile
    # (first query, queries): decode and verify sizes, and prefill chunks split by the kernel into query
    # blocks of 32, 64 and 256, with their last key in the first and in the second tile
    blocks = [(tile // 2 - 40, 4), (tile // 2 + 40, 16), (tile - 100, 96), (tile + 88, 4),
              (tile + tile // 2, 64), (2 * tile - 8, 4), (100, 300), (0, 800)]
    for first, count in blocks:
        shortest = plan.context(-(-(first + count) // 16) * 16)
        stride = max(1, count // 4)
        reference = run(first, count, shortest)
        singles = [run(p, 1, shortest)[0] for p in range(first, first + count, stride)]
        if not all(torch.equal(reference[i * stride], one) for i, one in enumerate(singles)):
            return False
        for context in sorted({plan.context(shortest + 3 * 16), plan.context(shortest + tile // 2), longest}):
            if context > shortest and not torch.equal(run(first, count, context), reference):
                return False
    return True


# Plans (and per-shape verdicts on bf16 products) measured in this process, by what they depend on (the
# products' shapes, attention's, the device, dtypes and torch's thread count): a machine's kernels do not
# change while it runs, and tests build many engines over the same shapes.
CALIBRATIONS: dict[tuple, InvariancePlan | bool | None] = {}


def calibrate(matmuls: list[tuple[object, int, int]], attention: tuple | None, device: torch.device,
              dtype: torch.dtype) -> InvariancePlan | None:
    """The cheapest plan under which this machine's kernels keep rows invariant, or None if no candidate
    does. matmuls: (callable x [R, in] -> [R, out], in, the most rows to check) for every distinct
    projection of the models; attention: (num_heads, num_kv_heads, head_dim, mask_dtype) of torch's
    attention kernel, which the plan must also shape, or None where every forward under a plan attends by
    the rows' own attention (engine/ops/row_attention.py: invariant by construction, so neither queries
    nor contexts are padded, and torch's kernel, which on some machines no padding makes invariant, is not
    measured)."""
    # at least one multiple of every candidate: a product of fewer rows (an LM head that sees one) still
    # runs padded to the quantum
    inputs = [(fn, random_rows(max(rows, ROW_QUANTA[-1]), n_in, device, dtype)) for fn, n_in, rows in matmuls]
    row_quantum = next((q for q in ROW_QUANTA if all(rows_invariant(fn, x, q) for fn, x in inputs)), None)
    if row_quantum is None:
        return None
    if attention is None:
        return InvariancePlan(row_quantum=row_quantum, key_tile=KEY_TILE)
    num_heads, num_kv_heads, head_dim, mask_dtype = attention
    for query_quantum in ROW_QUANTA:
        for min_keys in MIN_KEYS:
            plan = InvariancePlan(row_quantum=row_quantum, query_quantum=query_quantum, key_tile=KEY_TILE,
                                  min_keys=min_keys)
            if attention_invariant(plan, num_heads, num_kv_heads, head_dim, device, dtype, mask_dtype):
                return plan
    return None
