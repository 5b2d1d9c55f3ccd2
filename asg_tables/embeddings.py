"""Read the speech-token rows of a Hugging Face checkpoint's embedding matrix without loading the model.

Only the safetensors header and the requested rows are read (safe_open + get_slice), so a Llasa-8B
checkpoint (193,800 x 4,096 embeddings in one shard of several GB) costs ~0.5 GB of reads, not 16 GB.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

# Llasa's layout: <|s_0|> is token 128264 and X-codec2 has 65,536 codes.
LLASA_SPEECH_OFFSET = 128264
LLASA_NUM_SPEECH_TOKENS = 65536

INPUT_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight")
OUTPUT_NAMES = ("lm_head.weight",)


def _weight_files(model_dir: Path) -> dict[str, Path]:
    """tensor name -> safetensors file, from the shard index if there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            out.update({name: f for name in handle.keys()})  # noqa: SIM118
    return out


def find_embedding(model_dir: str | Path, which: str = "input") -> tuple[str, Path]:
    """(tensor name, file) of the input embeddings, or of the LM head for which="output" (tied models have
    none and fall back to the input embeddings)."""
    files = _weight_files(Path(model_dir))
    names = OUTPUT_NAMES + INPUT_NAMES if which == "output" else INPUT_NAMES
    if which not in ("input", "output"):
        raise ValueError("which must be 'input' or 'output'")
    for name in names:
        if name in files:
            return name, files[name]
    raise KeyError(f"no embedding tensor among {names} in {model_dir}")


def read_embedding_rows(
    model_dir: str | Path, offset: int = 0, count: int | None = None, which: str = "input"
) -> tuple[torch.Tensor, dict]:
    """Rows [offset, offset + count) of the embedding matrix, in its stored dtype, and provenance metadata."""
    name, file = find_embedding(model_dir, which)
    with safe_open(str(file), framework="pt") as handle:
        sl = handle.get_slice(name)
        vocab, dim = sl.get_shape()
        count = vocab - offset if count is None else count
        if offset < 0 or offset + count > vocab:
            raise ValueError(f"rows [{offset}, {offset + count}) outside the {vocab}-row matrix {name}")
        rows = sl[offset : offset + count]
    meta = {
        "source": str(Path(model_dir).name),
        "tensor": name,
        "which": which,
        "source_vocab_size": int(vocab),
        "rows_sha256": hashlib.sha256(rows.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
        "shard_sha256_head": _head_hash(file),
    }
    return rows, meta


def _head_hash(file: Path, nbytes: int = 1 << 20) -> str:
    """sha256 of the file's first MiB (header + start of data): identifies the checkpoint cheaply."""
    with open(file, "rb") as f:
        return hashlib.sha256(f.read(nbytes)).hexdigest()


def vocab_size_of(model_dir: str | Path) -> int | None:
    config = Path(model_dir) / "config.json"
    if config.exists():
        return json.loads(config.read_text()).get("vocab_size")
    return None
