"""Random-weight X-codec2 and w2v-bert directories, built from the real classes, for tests and dry runs.

`full` sizes are the released ones (X-codec2: xcodec2's class defaults, about 236 M parameters without the
semantic model; w2v-bert-2.0: transformers' Wav2Vec2BertConfig defaults, 24 layers of width 1024). The
`reduced` sizes keep every layer type and every width that XCodec2Model fixes (its fc_prior is 2048 -> 2048
and fc_post_a 2048 -> 1024, so the codec encoder and the semantic features add up to 2048 channels and the
decoder is 1024 wide) and shrink the rest: semantic width 64 (16 layers, since layer 16's output is used),
codec encoder ngf 8 with 1984 output channels, decoder depth 1 of 12 (about 55 M parameters in all).

With xcodec2's initialisation (std 0.02) every frame of a random codec quantises to one code; `spread`
scales fc_prior (the layer before the quantiser) so that different audio gets different codes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pcgtts.engine.codec.xcodec2.loading import REDUCED_KEY, SEMANTIC_FILES, build_model, save_model

REDUCED_CODEC = {"semantic_hidden_size": 64,
                 REDUCED_KEY: {"encoder": {"ngf": 8, "hidden_dim": 2048 - 64}, "decoder": {"depth": 1}}}
FULL_CODEC = {"semantic_hidden_size": 1024}
REDUCED_SEMANTIC = {"hidden_size": 64, "num_hidden_layers": 16, "num_attention_heads": 2,
                    "intermediate_size": 128, "output_hidden_size": 64, "conv_depthwise_kernel_size": 3}


def save_random_semantic(root: Path, reduced: bool = True, seed: int = 0) -> Path:
    """A w2v-bert-2.0-shaped directory (config.json, preprocessor_config.json, model.safetensors)."""
    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel

    torch.manual_seed(seed)
    config = Wav2Vec2BertConfig(**(REDUCED_SEMANTIC if reduced else {}))
    Wav2Vec2BertModel(config).eval().save_pretrained(str(root))
    # w2v-bert-2.0's preprocessor settings (80 mel bins stacked in pairs: 160 features at 50 per second).
    SeamlessM4TFeatureExtractor(feature_size=80, num_mel_bins=80, sampling_rate=16000, stride=2,
                                padding_value=1.0).save_pretrained(str(root))
    assert all((root / name).is_file() for name in SEMANTIC_FILES)
    return root


def save_random_codec(root: Path, reduced: bool = True, seed: int = 0, spread: float = 50.0) -> Path:
    """An X-codec2 directory with random weights (semantic model weights not included)."""
    config = {"model_type": "xcodec2", **(REDUCED_CODEC if reduced else FULL_CODEC)}
    torch.manual_seed(seed)
    model = build_model(config, semantic_dir=None)
    with torch.no_grad():
        model.fc_prior.weight.mul_(spread)
    return save_model(model, config, root)
