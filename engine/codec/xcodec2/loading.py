"""Builds `xcodec2.XCodec2Model` from local directories only: nothing is fetched from a hub.

`XCodec2Model.__init__` calls `Wav2Vec2BertModel.from_pretrained("facebook/w2v-bert-2.0")` and
`AutoFeatureExtractor.from_pretrained(...)` (the semantic model that encoding runs; decoding never does).
We construct the model with those two names, as seen by `xcodec2.modeling_xcodec2`, bound for the duration
of the constructor to loaders of a local directory (or, decode-only, to a placeholder that says what is
missing), then load the codec checkpoint's weights ourselves.

A codec directory holds `config.json` and `model.safetensors` (or `pytorch_model.bin`), as the Hugging Face
repository HKUSTAudio/xcodec2 does. Its config.json may also carry a `pcgtts_reduced` block,
`{"encoder": {...}, "decoder": {...}}`: constructor arguments for xcodec2's own `CodecEncoder_Transformer`
and `CodecDecoderVocos`, used to build test-sized codecs from the real classes; absent in the released
checkpoint, whose sizes are the classes' defaults.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

import torch
from pcgtts.engine.codec.base import EncoderUnavailable
from pcgtts.engine.codec.xcodec2.stand_ins import xcodec2_imported
from torch import nn

SEMANTIC_REPO = "facebook/w2v-bert-2.0"
SEMANTIC_ENV = "PCGTTS_SEMANTIC_MODEL"
SEMANTIC_FILES = ("config.json", "preprocessor_config.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
REDUCED_KEY = "pcgtts_reduced"
GET_SEMANTIC = (f"download it once on a machine with network access (`hf download {SEMANTIC_REPO} "
                f"--local-dir DIR`) and pass --semantic-model DIR (env {SEMANTIC_ENV}), or leave it in the "
                f"Hugging Face cache (HF_HOME)")


def _weights_file(root: Path) -> Path | None:
    return next((root / name for name in WEIGHT_FILES if (root / name).is_file()), None)


def check_semantic_dir(root: Path) -> Path:
    missing = [name for name in SEMANTIC_FILES if not (root / name).is_file()]
    if _weights_file(root) is None:
        missing.append(" or ".join(WEIGHT_FILES))
    if missing:
        raise FileNotFoundError(f"semantic model directory {root} lacks {', '.join(missing)}: it must hold "
                                f"{SEMANTIC_REPO}; {GET_SEMANTIC}")
    return root


def find_semantic_dir(explicit: str | Path | None = None) -> tuple[Path | None, str]:
    """-> (directory of w2v-bert-2.0, "") or (None, why not). An explicit directory (argument, else the
    environment variable) must be valid; otherwise the Hugging Face cache is looked up, offline."""
    explicit = explicit or os.environ.get(SEMANTIC_ENV) or None
    if explicit is not None:
        return check_semantic_dir(Path(explicit)), ""
    try:
        from huggingface_hub import snapshot_download

        cached = Path(snapshot_download(SEMANTIC_REPO, local_files_only=True))
        return check_semantic_dir(cached), ""
    except Exception as exc:  # not cached (or incomplete): decode-only
        return None, (f"encoding voices needs the semantic model {SEMANTIC_REPO}, which is neither given "
                      f"(--semantic-model / {SEMANTIC_ENV}) nor in the Hugging Face cache "
                      f"({type(exc).__name__}); {GET_SEMANTIC}")


class SemanticMissing(nn.Module):
    """Stands where the semantic model would be in a decode-only codec; calling it says what is missing."""

    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason

    def forward(self, *args, **kwargs):
        raise EncoderUnavailable(self.reason)

    def __call__(self, *args, **kwargs):  # also stands in for the feature extractor, a plain callable
        raise EncoderUnavailable(self.reason)


class _LocalLoader:
    """Has the `from_pretrained(name, **kwargs)` that xcodec2's constructor calls; loads `root` instead."""

    def __init__(self, load):
        self.load = load

    def from_pretrained(self, _hub_name: str, **kwargs):
        return self.load(**kwargs)


def _semantic_loaders(semantic_dir: Path | None, reason: str):
    if semantic_dir is None:
        placeholder = SemanticMissing(reason)
        return _LocalLoader(lambda **_: placeholder), _LocalLoader(lambda **_: placeholder)
    from transformers import AutoFeatureExtractor, Wav2Vec2BertModel

    def model(**kwargs):
        return Wav2Vec2BertModel.from_pretrained(str(semantic_dir), local_files_only=True, **kwargs)

    def features(**kwargs):
        return AutoFeatureExtractor.from_pretrained(str(semantic_dir), local_files_only=True, **kwargs)

    return _LocalLoader(model), _LocalLoader(features)


@contextlib.contextmanager
def _bound(module, **names):
    """Rebinds global names of `module` for the duration of the block."""
    previous = {name: getattr(module, name) for name in names}
    for name, value in names.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)


def build_model(config: dict, semantic_dir: Path | None, reason: str = "no semantic model"):
    """A freshly initialised `XCodec2Model` for `config` (the parsed config.json)."""
    mx = xcodec2_imported()
    reduced = config.get(REDUCED_KEY) or {}
    semantic_model, feature_extractor = _semantic_loaders(semantic_dir, reason)
    names = {"Wav2Vec2BertModel": semantic_model, "AutoFeatureExtractor": feature_extractor}
    for part, name in (("encoder", "CodecEncoder_Transformer"), ("decoder", "CodecDecoderVocos")):
        if reduced.get(part):
            names[name] = functools.partial(getattr(mx, name), **reduced[part])
    fields = {k: v for k, v in config.items() if k in ("semantic_hidden_size", "codec_encoder_hidden_size",
                                                       "codec_decoder_hidden_size", "use_vocos")}
    with _bound(mx, **names):
        model = mx.XCodec2Model(mx.BigCodecConfig(**fields))
    return model.eval()


def _legacy_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoints saved with torch's old weight_norm name its tensors `weight_g` / `weight_v`; xcodec2's
    modules use the parametrization API (`parametrizations.weight.original0` / `original1`)."""
    renamed = {}
    for key, value in state.items():
        for old, new in ((".weight_g", ".parametrizations.weight.original0"),
                         (".weight_v", ".parametrizations.weight.original1")):
            if key.endswith(old):
                key = key[: -len(old)] + new
        renamed[key] = value
    return renamed


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(str(path), map_location="cpu", weights_only=True)


def load_model(codec_dir: Path, semantic_dir: Path | None, reason: str = "no semantic model"):
    """XCodec2Model with the checkpoint of `codec_dir`; decode-only (no semantic model) if semantic_dir
    is None. Semantic weights come from the codec checkpoint where it has them (as in xcodec2's own
    `from_pretrained`), else from `semantic_dir`."""
    config_path, weights = codec_dir / "config.json", _weights_file(codec_dir)
    if not config_path.is_file() or weights is None:
        raise FileNotFoundError(f"{codec_dir} is not an X-codec2 checkpoint directory: it needs config.json "
                                f"and {' or '.join(WEIGHT_FILES)} (from HKUSTAudio/xcodec2)")
    model = build_model(json.loads(config_path.read_text()), semantic_dir, reason)
    state = _legacy_weight_norm(read_weights(weights))
    if semantic_dir is None:
        state = {k: v for k, v in state.items() if not k.startswith("semantic_model.")}
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("semantic_model.")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{weights} does not match xcodec2's XCodec2Model: missing {missing[:5]} "
                         f"({len(missing)}), unexpected {result.unexpected_keys[:5]} "
                         f"({len(result.unexpected_keys)})")
    return model


def save_model(model, config: dict, codec_dir: Path) -> Path:
    """Writes a codec directory `load_model` reads (config.json + model.safetensors), semantic model
    weights excluded (they live in the semantic model's own directory)."""
    from safetensors.torch import save_file

    codec_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not k.startswith("semantic_model.")}
    save_file(state, str(codec_dir / "model.safetensors"))
    (codec_dir / "config.json").write_text(json.dumps(config, indent=1))
    return codec_dir
