"""Server configuration: one table of options, each settable by CLI flag or PCGTTS_* environment variable.

Precedence: CLI flag > environment variable > default. `pcgtts serve` with no arguments serves the
embedded model on 127.0.0.1:8000 (containers set PCGTTS_HOST=0.0.0.0).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from pcgtts.tts import TTSConfig

MiB = 1 << 20


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "pcgtts"


def _opt(default=None, help: str = "", factory=None):
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class ServerSettings:
    # Each option is also read from PCGTTS_<NAME>; `model=None` serves the embedded demo model. Options that
    # configure the TTS service take its defaults (TTSConfig, which takes the engine's), never a copy.
    model: str | None = _opt(None, "model bundle or Llasa checkpoint directory (default: models/demo-en)")
    codec: str | None = _opt(None, "codec directory (overrides the bundle's)")
    draft: str | None = _opt(None, "draft model directory (overrides the bundle's)")
    semantic_model: str | None = _opt(None, "X-codec2 only: w2v-bert-2.0 directory, for encoding voice clips "
                                            "(default: the Hugging Face cache, offline; none: decode only)")
    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "TCP port")
    device: str = _opt(TTSConfig.device, "cpu | cuda | cuda:N")
    engine: str = _opt(TTSConfig.engine, "builtin (this package's engine, the default) | vllm (vLLM's "
                                         "AsyncLLM with pcgtts' acceptance rules; make install-vllm)")
    acceptance: str = _opt(TTSConfig.acceptance,
                           "speculative acceptance rule: pcg | exact | block | pcg-block | ssd | topk "
                           "| lantern | none")
    num_speculative_tokens: int = _opt(TTSConfig.num_speculative_tokens, "draft length γ (0 = target only)")
    draft_confidence: float = _opt(TTSConfig.draft_confidence, "θ: a row verifies its next draft only while "
                                   "the draft's top probability at each position so far is at least this, "
                                   "so γ is the most it drafts (builtin engine; 0 = always γ)")
    draft_branches: int = _opt(TTSConfig.draft_branches, "k: a token tree of k branches of γ drafts, k "
                               "candidates for the first position verified by recursive rejection sampling "
                               "(builtin engine, feature-head drafts; exact and pcg; 1 = one chain)")
    speculation: str = _opt(TTSConfig.speculation, "auto: per engine step, speculate or decode with the "
                            "target alone, whichever measured faster at that batch size; always: every step "
                            "speculates (seeded requests speculate on every step either way)")
    speculation_lengths: str | None = _opt(None, "more draft lengths auto may choose per batch size besides "
                                          "γ, comma-separated (e.g. 5; builtin engine): the engine is "
                                          "sized for the longest, seeded requests keep γ; default: "
                                          + (",".join(map(str, TTSConfig.speculation_lengths)) or "none"))
    asg_table: str | None = _opt(None, "ASG table file (the θ choice) for pcg/pcg-block/lantern; default: "
                                        "the bundle's")
    extra_asg_tables: str | None = _opt(None, "more ASG tables requests may pick by name (`asg_table`): "
                                              "comma-separated FILE or NAME=FILE (name: the file's stem)")
    kv_budget_tokens: int | None = _opt(TTSConfig.kv_budget_tokens, "KV-cache capacity in tokens per model")
    decode_graphs: str = _opt(TTSConfig.decode_graphs, "decode forwards from captured graphs: eager | "
                              "compile (torch.compile, CPU: minutes at start-up, cached under "
                              "DATA_DIR/inductor) | cuda_graphs | auto (cuda_graphs on CUDA, else eager)")
    kv_mirror_mb: int = _opt(TTSConfig.kv_mirror_mb, "eager CPU decoding: MiB per model for each running "
                             "sequence's K/V kept contiguous, so attention reads it without gathering blocks "
                             "(0 = off)")
    deterministic: str = _opt(TTSConfig.deterministic, "batch-invariant forwards, so a seed fixes the audio "
                              "whatever shares the batch: seeded (steps holding a seeded request, and "
                              "prefills) | always | off")
    cpu_attention: str = _opt(TTSConfig.cpu_attention, "eager CPU float32 attention: rows (each sequence "
                              "over its own keys, read in place) | sdpa (torch's kernel, padded context)")
    cpu_weights: str = _opt(TTSConfig.cpu_weights, "eager CPU float32 projections: auto (bf16 with AMX, "
                            "else fp16) | fp16 (multiply from an "
                            "fp16 copy where the checkpoint's weights are exactly fp16) | fp32 | bf16 (fp16, "
                            "and bf16 products at 16 rows or more in unseeded steps, oneDNN/AMX) | "
                            "int8 (fp16, and fbgemm's dynamic int8 qkv, o and gate_up products at 8 rows "
                            "or more in unseeded steps)")
    cpu_kv: str = _opt(TTSConfig.cpu_kv, "eager CPU float32 K/V store under the rows' attention: fp16 (K/V "
                       "rounded to fp16 as written, half the bytes attention reads) | fp32")
    max_num_seqs: int = _opt(TTSConfig.max_num_seqs, "sequences decoded together per engine step")
    max_waiting: int = _opt(TTSConfig.max_waiting, "queued requests before new ones get HTTP 429")
    max_tokens: int = _opt(TTSConfig.max_tokens, "default cap on speech tokens per sentence")
    decode_threads: int = _opt(TTSConfig.decode_threads,
                               "codec decode threads (streams are spread over them; add with spare cores)")
    codec_process: str = _opt(TTSConfig.codec_process, "where the codec runs: process (a process of its own "
                              "per decode thread, so codec and engine never wait for each other's "
                              "interpreter lock) | thread (in the server's process) | auto (process on the "
                              "CPU device)")
    initial_codec_chunk_frames: int | None = _opt(TTSConfig.initial_codec_chunk_frames,
                                                  "frames in the codec's first block (smaller: earlier "
                                                  "first audio, thinner early buffer); default: codec's")
    first_audio_max_hold_s: float = _opt(TTSConfig.first_audio_max_hold_s,
                                         "longest a stream's first audio is held back until the next chunk "
                                         "can follow it without a gap (0 = send at once)")
    torch_threads: int | None = _opt(None, "torch intra-op threads (default: 1 on CPU, where the engine "
                                           "and codec threads would contend, else torch's; 0 = torch's)")
    data_dir: str = _opt(help="where uploaded voices persist (SQLite + files under voices/)",
                         factory=lambda: str(_default_data_dir()))
    shared_voices: bool = _opt(False, "1 (or true): data_dir is shared by several replicas (a ReadWriteMany "
                                      "volume); the voice index then uses file locks, not WAL (the volume "
                                      "needs POSIX locks)")
    api_key: str | None = _opt(None, "require 'Authorization: Bearer KEY' on /v1/*")
    max_upload_mb: float = _opt(10.0, "largest voice upload / inline ref_audio, MiB")
    max_voices: int = _opt(1000, "most uploaded voices kept")
    min_voice_seconds: float = _opt(1.0, "shortest reference clip accepted")
    max_voice_seconds: float = _opt(30.0, "longest reference clip accepted")
    cors_origins: str | None = _opt(None, "comma-separated origins allowed by CORS and to open the WebSocket "
                                          "(the server's own origin always may; '*' allows any)")
    # 25 s: inside Kubernetes' default 30 s terminationGracePeriodSeconds, so the kubelet never SIGKILLs a
    # drain; most utterances finish well within it. Long-form deployments raise both together.
    drain_timeout_s: float = _opt(25.0, "on SIGTERM, seconds in-flight requests may run on before they are "
                                        "cut with an in-band error (/ready is 503 meanwhile)")
    log_level: str = _opt("info", "uvicorn log level")

    @property
    def effective_torch_threads(self) -> int | None:
        """Threads to set, or None to keep torch's default."""
        if self.torch_threads is not None:
            return self.torch_threads or None
        return 1 if self.device == "cpu" else None

    @property
    def extra_asg_table_paths(self) -> dict[str, Path]:
        out = {}
        for item in comma_items(self.extra_asg_tables):
            name, _, path = item.rpartition("=")
            out[name or Path(path).stem] = Path(path)
        return out

    @property
    def speculation_length_values(self) -> tuple[int, ...]:
        """speculation_lengths as numbers (unset: TTSConfig's default; empty: none)."""
        if self.speculation_lengths is None:
            return TTSConfig.speculation_lengths
        try:
            return tuple(int(x) for x in comma_items(self.speculation_lengths))
        except ValueError:
            raise ValueError(f"speculation_lengths: expected comma-separated integers, got "
                             f"{self.speculation_lengths!r}") from None

    @property
    def allowed_origins(self) -> list[str]:
        return comma_items(self.cors_origins)

    @property
    def voices_dir(self) -> Path:
        return Path(self.data_dir) / "voices"

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * MiB)


def comma_items(text: str | None) -> list[str]:
    """The non-empty items of a comma-separated setting, stripped ([] when unset)."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def env_name(name: str) -> str:
    return "PCGTTS_" + name.upper()


def flag(text: str) -> bool:
    """A yes/no setting's value: 1, true, yes, on or 0, false, no, off (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1 or 0 (true/false, yes/no, on/off), got {text!r}")


def _field_type(f):
    # Annotations are strings under `from __future__ import annotations`; the first type in them decides.
    text = f.type if isinstance(f.type, str) else f.type.__name__
    return {"int": int, "float": float, "bool": flag}.get(text.split(" ")[0].split("|")[0].strip(), str)


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One --flag per setting (only: the names of those to add; default all)."""
    for f in fields(ServerSettings):
        if only is not None and f.name not in only:
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        shown = "" if default is None else f", default {default}"
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_field_type(f), default=None,
                            help=f"{f.metadata['help']} (env {env_name(f.name)}{shown})")


def settings_from(args: argparse.Namespace | None = None,
                  environ: dict[str, str] | None = None) -> ServerSettings:
    environ = os.environ if environ is None else environ
    values = {}
    for f in fields(ServerSettings):
        cli = getattr(args, f.name, None) if args is not None else None
        if cli is not None:
            values[f.name] = cli
        elif (env := environ.get(env_name(f.name))) not in (None, ""):
            values[f.name] = _field_type(f)(env)
    return ServerSettings(**values)
