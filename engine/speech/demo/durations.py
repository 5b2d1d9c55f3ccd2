"""Duration model of the demo phoneme family: frames per phoneme from the phoneme sequence and the voice.

The language model decides when a phoneme ends by sampling a marker at each frame, and those sampled
durations are what limit its intelligibility: on development sentences, forcing espeak-ng's own durations
took Whisper WER from 1.02 to 0.69 with the same weights (models/demo-en/README.md). espeak-ng's durations
are a deterministic function of the phoneme context and the voice's speaking rate, which a small regressor
learns far better than the LM's per-frame hazard does (FastSpeech-style explicit durations). The decode
constraint then lets each phoneme end only inside a window around the predicted duration.

A bidirectional Transformer encoder over [reference codes ; phonemes]: the reference clip (the same codes
the LM's prompt carries) gives the voice's rate, the phoneme context gives the rest. It predicts
log(1 + frames) per phoneme. Bundle files: `duration/config.json`, `duration/model.safetensors`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.speech.demo.layout import MAX_PHONEMES, MAX_REF_FRAMES, PHONEME_OFFSET
from safetensors.torch import load_file, save_file
from torch import nn

MAX_TEXT_PHONEMES = 512
REF_STRIDE = 4


@dataclass(frozen=True)
class DurationConfig:
    codebook_size: int
    dim: int = 96
    layers: int = 3
    heads: int = 4
    # added to the predicted log(1 + frames) before rounding: half the held-out residual variance (the
    # lognormal mean), since exp of a mean log-duration undershoots the mean duration (utterances 4% short)
    log_bias: float = 0.0


class DurationModel(nn.Module):
    def __init__(self, cfg: DurationConfig):
        super().__init__()
        self.cfg = cfg
        self.phoneme = nn.Embedding(MAX_PHONEMES, cfg.dim)
        self.code = nn.Embedding(cfg.codebook_size, cfg.dim)
        # the reference enters as one vector per REF_STRIDE frames: its rate, not its detail, is needed
        self.ref_pool = nn.Conv1d(cfg.dim, cfg.dim, REF_STRIDE, stride=REF_STRIDE)
        self.ref_position = nn.Embedding(MAX_REF_FRAMES // REF_STRIDE, cfg.dim)
        self.text_position = nn.Embedding(MAX_TEXT_PHONEMES, cfg.dim)
        layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, 4 * cfg.dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, 1)

    def forward(self, phonemes: torch.Tensor, phoneme_valid: torch.Tensor, ref: torch.Tensor,
                ref_valid: torch.Tensor) -> torch.Tensor:
        """phonemes Long[B, P] (index into the inventory, i.e. token id - PHONEME_OFFSET), ref Long[B, R]
        codes, both with Bool validity masks -> predicted log(1 + frames) [B, P] (junk where invalid)."""
        r = ref.shape[1] // REF_STRIDE
        ref, ref_valid = ref[:, :r * REF_STRIDE], ref_valid[:, :r * REF_STRIDE]  # whole windows only
        codes = (self.code(ref) * ref_valid[..., None]).transpose(1, 2)  # [B, d, R]
        x_ref = self.ref_pool(codes).transpose(1, 2) if r else codes.transpose(1, 2)  # [B, R / REF_STRIDE, d]
        x_ref = x_ref + self.ref_position(torch.arange(r, device=ref.device))
        pooled_valid = ref_valid[:, REF_STRIDE - 1::REF_STRIDE]  # [B, R / REF_STRIDE] window fully valid
        p = phonemes.shape[1]
        x_txt = self.phoneme(phonemes) + self.text_position(torch.arange(p, device=ref.device))  # [B, P, d]
        h = self.encoder(torch.cat([x_ref, x_txt], 1),
                         src_key_padding_mask=~torch.cat([pooled_valid, phoneme_valid], 1))  # [B, r + P, d]
        return self.head(self.norm(h[:, r:])).squeeze(-1)

    @torch.no_grad()
    def predict(self, phoneme_ids: list[int], ref_codes: np.ndarray | None) -> list[int]:
        """Frames for each phoneme (token ids) of one text spoken in the voice of `ref_codes` (first
        MAX_REF_FRAMES used, as in the LM's prompt; None: no reference)."""
        if len(phoneme_ids) > MAX_TEXT_PHONEMES:
            raise ValueError(f"at most {MAX_TEXT_PHONEMES} phonemes per chunk, got {len(phoneme_ids)}")
        ref = [] if ref_codes is None else np.asarray(ref_codes, dtype=np.int64)[:MAX_REF_FRAMES].tolist()
        phonemes = torch.tensor([[i - PHONEME_OFFSET for i in phoneme_ids]])
        refs = torch.tensor([ref], dtype=torch.long).reshape(1, len(ref))
        return self.frames(phonemes, torch.ones_like(phonemes, dtype=torch.bool), refs,
                           torch.ones_like(refs, dtype=torch.bool))[0].tolist()

    def frames(self, phonemes: torch.Tensor, phoneme_valid: torch.Tensor, ref: torch.Tensor,
               ref_valid: torch.Tensor) -> torch.Tensor:
        """forward()'s inputs -> Long[B, P] whole frames per phoneme (0 where not valid)."""
        return whole_frames(self(phonemes, phoneme_valid, ref, ref_valid) + self.cfg.log_bias, phoneme_valid)

    def save(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(asdict(self.cfg)))
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()},
                  str(out_dir / "model.safetensors"))

    @classmethod
    def load(cls, root: Path) -> DurationModel:
        model = cls(DurationConfig(**json.loads((root / "config.json").read_text())))
        model.load_state_dict(load_file(str(root / "model.safetensors")))
        return model.eval()


def whole_frames(log_frames: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Predicted log(1 + frames) [B, P] -> Long[B, P] whole frames (0 where not valid), rounding phoneme
    boundaries rather than each duration: the corpus's durations are differences of rounded start times,
    and rounding each short phoneme on its own would drift (three 0.4-frame phonemes would take none)."""
    frames = torch.expm1(log_frames).clamp_min(0) * valid  # [B, P]
    ends = frames.cumsum(-1).round().long()  # [B, P] rounded end of each phoneme
    return torch.diff(ends, dim=-1, prepend=torch.zeros_like(ends[:, :1])) * valid
