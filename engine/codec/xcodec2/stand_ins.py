"""Stand-ins for two of `xcodec2`'s declared dependencies that cannot (or should not) sit next to our torch.

* `torchaudio`: `xcodec2/vq/bs_roformer5.py` runs `import torchaudio` and never uses the name; PyPI has no
  torchaudio build for our torch, so an empty module satisfies that import.
* `torchtune`: xcodec2 uses one class of it, `torchtune.modules.RotaryPositionalEmbeddings`. Importing any
  part of torchtune runs its package `__init__`, which requires torchao and imports its datasets, models and
  generation packages (datasets, torchdata, sentencepiece, tiktoken, ...): a large install pinned to other
  torch releases for one small module. `RotaryPositionalEmbeddings` below is a re-implementation of that
  class's computation (torchtune 0.6.1).

`xcodec2_imported()` puts the stand-ins into `sys.modules` only while xcodec2's modules import, and only
for a package that is not installed, then removes them, so no other library ever sees them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types

import torch
from torch import nn


class RotaryPositionalEmbeddings(nn.Module):
    """Rotary position embedding with torchtune 0.6.1's conventions.

    x: [b, s, n_h, h_d] -> same shape. Position p is the index along dim 1. Each consecutive pair
    (x[..., 2j], x[..., 2j+1]) is rotated by the angle p * base**(-2j/dim), in float32, and the result is cast
    back to x's dtype. xcodec2 passes [b, heads, t, d], so its "position" is the head index: reproduced
    as is, since the released weights were trained with exactly that.
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: int = 10_000):
        super().__init__()
        self.dim, self.max_seq_len, self.base = dim, max_seq_len, base
        # Same float32 arithmetic as torchtune (1 / base**(2j/dim)), so angles agree bit for bit.
        exponents = torch.arange(0, dim, 2)[: dim // 2].float() / dim
        self.register_buffer("inv_freq", 1.0 / (base ** exponents), persistent=False)  # [dim/2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.size(1), dtype=self.inv_freq.dtype, device=x.device)
        angles = torch.outer(positions, self.inv_freq)  # [s, dim/2]
        cos = angles.cos()[None, :, None, :]  # [1, s, 1, dim/2]
        sin = angles.sin()[None, :, None, :]
        pairs = x.float().reshape(*x.shape[:-1], -1, 2)  # [b, s, n_h, dim/2, 2]
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        return rotated.flatten(3).type_as(x)


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name, f"pcgtts stand-in for {name} (see engine.codec.xcodec2.stand_ins)")
    module.__dict__.update(attrs)
    return module


def stand_in_modules() -> dict[str, types.ModuleType]:
    """The stand-ins needed here: one per declared dependency that is not installed."""
    out: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("torchaudio") is None:
        out["torchaudio"] = _module("torchaudio")
    if importlib.util.find_spec("torchtune") is None:
        modules = _module("torchtune.modules", RotaryPositionalEmbeddings=RotaryPositionalEmbeddings)
        out["torchtune"] = _module("torchtune", modules=modules)
        out["torchtune.modules"] = modules
    return out


@contextlib.contextmanager
def _installed(modules: dict[str, types.ModuleType]):
    previous = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in previous.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


MISSING_PACKAGE = ("the X-codec2 codec needs the optional `xcodec2` package and its dependencies: run "
                   "`make install-xcodec2` (or see the README, 'Serve a real Llasa checkpoint')")


def xcodec2_imported() -> types.ModuleType:
    """`xcodec2.modeling_xcodec2`, imported with the stand-ins where needed."""
    if "xcodec2.modeling_xcodec2" in sys.modules:
        return sys.modules["xcodec2.modeling_xcodec2"]
    if importlib.util.find_spec("xcodec2") is None:
        raise ImportError(MISSING_PACKAGE)
    import transformers  # noqa: F401  (imported first, so its optional-package probes never see a stand-in)

    with _installed(stand_in_modules()):
        try:
            return importlib.import_module("xcodec2.modeling_xcodec2")
        except ImportError as exc:
            raise ImportError(f"{MISSING_PACKAGE}; importing it failed: {exc}") from exc
