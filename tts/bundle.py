"""A model bundle: everything a TTS deployment loads from one directory.

Two layouts are recognised:

* a pcgtts bundle (the embedded model) with a `pcgtts.json` manifest::

      {"family": "demo-phoneme", "target": "target", "draft": "draft", "codec": "codec",
       "asg_table": "asg.safetensors", "voices": "voices",
       "extra_asg_tables": {"theta-0.45": "asg-0.45.safetensors"},
       "sampling": {"temperature": 0.7}}

  paths are relative to the bundle directory; `draft`, `asg_table`, `voices`, `extra_asg_tables` (more
  tables a request may pick by name) and `sampling` (the model's default sampling settings, SamplingParams
  field names) are optional;
* a plain Hugging Face Llasa checkpoint directory (config.json + safetensors + tokenizer files), served
  with the `llasa` family and an X-codec2 codec directory given separately.

Families and codecs are looked up by name in small registries so that `server` never imports them.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

# name -> "module:Class"; each class provides `from_dir(path) -> instance`.
FAMILIES = {
    "demo-phoneme": "pcgtts.engine.speech.demo.family:DemoPhonemeFamily",
    "llasa": "pcgtts.engine.speech.llasa:LlasaFamily",
}
CODECS = {
    "demo-mel": "pcgtts.engine.codec.demo.codec:DemoMelCodec",
    "xcodec2": "pcgtts.engine.codec.xcodec2:XCodec2Codec",
}

MANIFEST = "pcgtts.json"
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "demo-en"


def _load_class(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)


@dataclass
class ModelBundle:
    root: Path
    family_name: str
    target_dir: Path
    draft_dir: Path | None
    codec_name: str
    codec_dir: Path | None
    asg_table: Path | None
    voices_dir: Path | None
    extra_asg_tables: dict[str, Path] = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)  # default temperature / top_p / ... for this model

    @classmethod
    def from_dir(cls, root: str | Path, *, codec_dir: str | Path | None = None,
                 draft_dir: str | Path | None = None) -> ModelBundle:
        root = Path(root)
        manifest = root / MANIFEST
        if manifest.exists():
            spec = json.loads(manifest.read_text())

            def rel(key: str) -> Path | None:
                return root / spec[key] if spec.get(key) else None

            return cls(
                root=root,
                family_name=spec["family"],
                target_dir=rel("target") or root,
                draft_dir=Path(draft_dir) if draft_dir else rel("draft"),
                codec_name=spec.get("codec_type", "demo-mel"),
                codec_dir=Path(codec_dir) if codec_dir else rel("codec"),
                asg_table=rel("asg_table"),
                voices_dir=rel("voices"),
                extra_asg_tables={name: root / p for name, p in spec.get("extra_asg_tables", {}).items()},
                sampling=dict(spec.get("sampling", {})),
            )
        # A bare Hugging Face checkpoint: Llasa layout, X-codec2 codec from elsewhere.
        return cls(root=root, family_name="llasa", target_dir=root,
                   draft_dir=Path(draft_dir) if draft_dir else None, codec_name="xcodec2",
                   codec_dir=Path(codec_dir) if codec_dir else None, asg_table=None, voices_dir=None)

    def load_family(self):
        family = _load_class(FAMILIES[self.family_name])
        # A family that reads the checkpoint's own tokenizer (Llasa) finds it with the target's weights.
        return family.from_dir(self.target_dir if family.tokenizer_in_target else self.root)

    def load_codec(self, device: str | None = None, semantic_model: str | Path | None = None):
        """device: for codecs that take one (the others run on the CPU); semantic_model: X-codec2's, an
        error for a codec that does not take one. Each codec lists what it takes in `load_options`."""
        codec = _load_class(CODECS[self.codec_name])
        options = {"device": device, "semantic_model": semantic_model}
        if semantic_model is not None and "semantic_model" not in codec.load_options:
            raise ValueError(f"the {self.codec_name} codec takes no semantic model")
        return codec.from_dir(self.codec_dir, **{k: v for k, v in options.items()
                                                  if v is not None and k in codec.load_options})
