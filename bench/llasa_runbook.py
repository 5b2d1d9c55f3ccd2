"""Prepares bench/llasa_gpu.sh's run: checks the local directories, fills the absent ones with random
weights of the real shapes, makes the draft, and writes a bundle manifest for the acceptance sweep.

    python -m pcgtts.bench.llasa_runbook --out DIR [--target LLASA_DIR] [--draft DIR] [--codec XCODEC2_DIR]
                                  [--semantic W2V_BERT_DIR] [--draft-layers 3] [--shape llasa-1b]

Writes DIR/setup.env (TARGET, DRAFT, CODEC, SEMANTIC, RANDOM_PARTS: shell assignments) and
DIR/bundle/pcgtts.json (family llasa, codec xcodec2, the ASG table expected at DIR/asg.safetensors).
Without --draft the draft is the target's first --draft-layers layers with its embeddings, final norm
and head (the PCG paper's draft is a 3-layer subset of the target, but trained; an untrained subset
accepts less). Random stand-ins:
target + draft from bench.engine_bench's random pair of --shape with a Llasa-layout tokenizer; X-codec2
and w2v-bert-2.0 at full size (--reduced-codec: the test sizes). A real codec without a semantic model is
served decode-only (the sweep decodes only); a random semantic model is made only for a random codec.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch


def layer_subset_draft(target: Path, out: Path, layers: int) -> Path:
    """The target's first `layers` decoder layers plus embeddings, final norm and LM head."""
    from pcgtts.engine.model.loader import safetensors_files
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((target / "config.json").read_text())
    if layers >= config["num_hidden_layers"]:
        raise ValueError(f"--draft-layers {layers} must be below the target's {config['num_hidden_layers']}")
    tensors = {}
    for file in safetensors_files(target):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers:
                    tensors[name] = f.get_tensor(name)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}, indent=1))
    return out


def _present(kind: str, path: Path | None, required: tuple[str, ...]) -> bool:
    if path is None:
        print(f"{kind}: not given -> random weights")
        return False
    missing = [name for name in required if not any(path.glob(name))]
    if missing:
        raise SystemExit(f"{kind}: {path} lacks {', '.join(missing)}")
    print(f"{kind}: {path}")
    return True


def prepare(args: argparse.Namespace) -> dict[str, str]:
    from pcgtts.engine.codec.xcodec2.synthetic import save_random_codec, save_random_semantic

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    randoms = []
    target, draft = args.target, args.draft
    if _present("target (Llasa)", target, ("config.json", "*.safetensors", "tokenizer.json")):
        if draft is None:
            draft = layer_subset_draft(target, out / f"draft-{args.draft_layers}-layers", args.draft_layers)
            print(f"draft: the target's first {args.draft_layers} layers -> {draft}")
    else:
        from pcgtts.bench.engine_bench import random_pair
        from pcgtts.engine.speech.llasa_synthetic import save_llasa_tokenizer

        pair = random_pair(out / "random", args.shape, residual_gain=0.1, device=args.device)
        save_llasa_tokenizer(pair.target)
        target, draft = pair.target, draft or pair.draft
        randoms.append(f"target+draft ({pair.description})")
    codec, semantic = args.codec, args.semantic
    if not _present("X-codec2", codec, ("config.json", "model.safetensors")):
        codec = save_random_codec(out / "random" / "xcodec2", reduced=args.reduced_codec)
        randoms.append("xcodec2")
        if semantic is None:
            semantic = save_random_semantic(out / "random" / "w2v-bert-2.0", reduced=args.reduced_codec)
            randoms.append("w2v-bert-2.0")
    elif semantic is None:
        print("semantic model: not given -> the Hugging Face cache if it holds facebook/w2v-bert-2.0, "
              "else decode-only (voice uploads get 501)")
    if semantic is not None:
        _present("semantic model (w2v-bert-2.0)", semantic, ("config.json", "preprocessor_config.json"))
    manifest = {"family": "llasa", "codec_type": "xcodec2", "target": str(Path(target).resolve()),
                "draft": str(Path(draft).resolve()), "codec": str(Path(codec).resolve()),
                "asg_table": str((out / "asg.safetensors").resolve())}
    (out / "bundle").mkdir(exist_ok=True)
    (out / "bundle" / "pcgtts.json").write_text(json.dumps(manifest, indent=1))
    setup = {"TARGET": manifest["target"], "DRAFT": manifest["draft"], "CODEC": manifest["codec"],
             "SEMANTIC": str(Path(semantic).resolve()) if semantic else "",
             "RANDOM_PARTS": ", ".join(randoms)}
    (out / "setup.env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in setup.items()))
    print(f"random stand-ins: {setup['RANDOM_PARTS'] or 'none'}")
    return setup


def main(argv: list[str] | None = None) -> int:
    from pcgtts.bench.engine_bench import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", type=Path, help="Llasa checkpoint directory (e.g. Llasa-1B)")
    parser.add_argument("--draft", type=Path, help="draft checkpoint (default: a layer subset of the target)")
    parser.add_argument("--codec", type=Path, help="X-codec2 directory (HKUSTAudio/xcodec2)")
    parser.add_argument("--semantic", type=Path, help="w2v-bert-2.0 directory")
    parser.add_argument("--draft-layers", type=int, default=3)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llasa-1b", help="random target's shape")
    parser.add_argument("--reduced-codec", action="store_true", help="random codec at the test sizes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    prepare(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
