"""Uploaded voices on disk: an SQLite table of metadata plus one audio file (and cached codec codes) each.

Layout under `root`::

    voices.sqlite3              id, name, transcript, created_at, sample_rate, duration, consent
    audio/<id>.wav              the reference clip, mono float32 at its original rate
    codes/<id>--<codec>.npy     codec codes of the clip, computed once per codec

Files are written to a temporary name, fsynced and renamed into place, and the row is inserted only
after its audio file exists; a crash therefore never leaves a row without its audio. Codes are a cache:
when the served codec changes (another `codec` key), they are recomputed from the stored audio.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

log = logging.getLogger("pcgtts.voices")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE,
    transcript TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    sample_rate INTEGER NOT NULL,
    duration REAL NOT NULL,
    consent TEXT
)
"""
_SAFE_KEY = re.compile(r"[^A-Za-z0-9_.-]+")


def name_key(name: str) -> str:
    """What makes two voice names the same: NFKC-normalised, case-folded (`ARIA` = `aria`, `Ä` = `ä`)."""
    return unicodedata.normalize("NFKC", name).casefold()


class VoiceExistsError(ValueError):
    """A voice with that name is already stored."""


@dataclass(frozen=True)
class StoredVoice:
    id: str
    name: str
    transcript: str
    created_at: int  # unix seconds
    sample_rate: int
    duration: float  # seconds
    consent: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# A shared store leaves other replicas' temp files alone until they are this old (an upload takes seconds).
SHARED_TEMP_GRACE_S = 600.0


class VoiceStore:
    """shared: the directory is used by several server replicas at once (a ReadWriteMany volume). SQLite
    then keeps a rollback journal with POSIX file locks (WAL needs shared memory, i.e. one host), waits for
    another replica's write instead of failing, and leaves young temp files to the replica writing them.
    The filesystem must implement POSIX advisory locks (CephFS, EFS and NFSv4 with locking do)."""

    def __init__(self, root: str | Path, shared: bool = False):
        self.root = Path(root)
        self.shared = shared
        self._audio_dir = self.root / "audio"
        self._codes_dir = self.root / "codes"
        for d in (self.root, self._audio_dir, self._codes_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.root / "voices.sqlite3", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute(f"PRAGMA busy_timeout={10_000 if shared else 0}")
        self._db.execute(f"PRAGMA journal_mode={'DELETE' if shared else 'WAL'}")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)
        self._recover()

    def _recover(self) -> None:
        """Drop temp files of interrupted writes and rows whose audio is gone."""
        grace = SHARED_TEMP_GRACE_S if self.shared else 0.0
        for d in (self._audio_dir, self._codes_dir):
            for tmp in d.glob(".*.tmp-*"):
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - tmp.stat().st_mtime >= grace:
                        tmp.unlink(missing_ok=True)
        for voice in self.list():
            if not self._audio_path(voice.id).exists():
                log.warning("voice %s (%s) lost its audio file; removing it", voice.id, voice.name)
                self.delete(voice.id)

    def _audio_path(self, voice_id: str) -> Path:
        return self._audio_dir / f"{voice_id}.wav"

    def _codes_path(self, voice_id: str, codec_key: str) -> Path:
        return self._codes_dir / f"{voice_id}--{_SAFE_KEY.sub('_', codec_key)}.npy"

    @staticmethod
    def _row(row: tuple) -> StoredVoice:
        return StoredVoice(*row)

    def create(self, name: str, transcript: str, audio: np.ndarray, sample_rate: int,
               consent: str | None = None) -> StoredVoice:
        """audio: float32 [n] mono. Raises VoiceExistsError when the name is taken (names are compared
        case-insensitively, Unicode included: see `name_key`)."""
        name = unicodedata.normalize("NFC", name)
        if self.find_by_name(name) is not None:
            raise VoiceExistsError(name)
        voice = StoredVoice(id=f"voice_{secrets.token_hex(8)}", name=name, transcript=transcript,
                            created_at=int(time.time()), sample_rate=int(sample_rate),
                            duration=round(audio.size / sample_rate, 4), consent=consent)
        buf = io.BytesIO()
        sf.write(buf, np.asarray(audio, np.float32), sample_rate, format="WAV", subtype="FLOAT")
        atomic_write(self._audio_path(voice.id), buf.getvalue())
        try:
            with self._lock:
                self._db.execute("INSERT INTO voices VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (voice.id, voice.name, voice.transcript, voice.created_at,
                                  voice.sample_rate, voice.duration, voice.consent))
        except sqlite3.IntegrityError as exc:  # lost a race on the name
            self._audio_path(voice.id).unlink(missing_ok=True)
            raise VoiceExistsError(name) from exc
        return voice

    def get(self, voice_id: str) -> StoredVoice | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM voices WHERE id = ?", (voice_id,)).fetchone()
        return self._row(row) if row else None

    def find_by_name(self, name: str) -> StoredVoice | None:
        """The voice whose name equals `name` up to case (Unicode case folding; SQLite's NOCASE folds
        ASCII only, so the rest is compared here)."""
        with self._lock:
            row = self._db.execute("SELECT * FROM voices WHERE name = ?", (name,)).fetchone()
        if row:
            return self._row(row)
        key = name_key(name)
        return next((v for v in self.list() if name_key(v.name) == key), None)

    def find(self, name_or_id: str) -> StoredVoice | None:
        return self.get(name_or_id) or self.find_by_name(name_or_id)

    def list(self) -> list[StoredVoice]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM voices ORDER BY created_at, name").fetchall()
        return [self._row(r) for r in rows]

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM voices").fetchone()[0]

    def delete(self, voice_id: str) -> bool:
        with self._lock:
            deleted = self._db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount > 0
        # Files go after the row, so a crash in between leaves only unreferenced files.
        self._audio_path(voice_id).unlink(missing_ok=True)
        for cached in self._codes_dir.glob(f"{voice_id}--*.npy"):
            cached.unlink(missing_ok=True)
        return deleted

    def load_audio(self, voice_id: str) -> tuple[np.ndarray, int]:
        audio, rate = sf.read(self._audio_path(voice_id), dtype="float32")
        return audio, int(rate)

    def load_codes(self, voice_id: str, codec_key: str) -> np.ndarray | None:
        path = self._codes_path(voice_id, codec_key)
        return np.load(path) if path.exists() else None

    def save_codes(self, voice_id: str, codec_key: str, codes: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, np.asarray(codes))
        atomic_write(self._codes_path(voice_id, codec_key), buf.getvalue())

    def close(self) -> None:
        with self._lock:
            self._db.close()
