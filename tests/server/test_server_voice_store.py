"""The voice store: SQLite rows + audio files + cached codes, persistence, crash recovery."""

from __future__ import annotations

import numpy as np
import pytest
from pcgtts.server.voice_store import VoiceExistsError, VoiceStore, atomic_write
from server_support import tone


def test_create_get_list_delete(tmp_path):
    store = VoiceStore(tmp_path)
    audio = tone(1.5, 22050)
    voice = store.create("Alice", "hello there", audio, 22050, consent="cons_1")
    assert voice.id.startswith("voice_") and voice.duration == pytest.approx(1.5)
    assert store.get(voice.id) == voice
    assert store.find("alice") == voice  # names are case-insensitive
    assert store.find(voice.id) == voice
    assert [v.id for v in store.list()] == [voice.id]
    stored, rate = store.load_audio(voice.id)
    assert rate == 22050 and np.array_equal(stored, audio)  # float WAV: lossless
    with pytest.raises(VoiceExistsError):
        store.create("ALICE", "again", audio, 22050)
    assert store.delete(voice.id) and not store.delete(voice.id)
    assert store.get(voice.id) is None and store.list() == []
    assert not any((tmp_path / "audio").iterdir())


def test_codes_are_cached_per_codec_and_removed_with_the_voice(tmp_path):
    store = VoiceStore(tmp_path)
    voice = store.create("bob", "hi", tone(1.0, 16000), 16000)
    assert store.load_codes(voice.id, "demo-mel-abc") is None
    store.save_codes(voice.id, "demo-mel-abc", np.arange(50))
    assert np.array_equal(store.load_codes(voice.id, "demo-mel-abc"), np.arange(50))
    assert store.load_codes(voice.id, "xcodec2/other") is None  # another codec recomputes
    store.delete(voice.id)
    assert not any((tmp_path / "codes").iterdir())


def test_voices_persist_across_reopen(tmp_path):
    store = VoiceStore(tmp_path)
    voice = store.create("carol", "persist me", tone(2.0, 16000), 16000)
    store.save_codes(voice.id, "k", np.array([3, 1, 4]))
    store.close()
    reopened = VoiceStore(tmp_path)
    assert reopened.get(voice.id) == voice
    assert np.array_equal(reopened.load_codes(voice.id, "k"), [3, 1, 4])


def test_recovery_drops_temp_files_and_rows_without_audio(tmp_path):
    store = VoiceStore(tmp_path)
    kept = store.create("kept", "a", tone(1.0, 16000), 16000)
    lost = store.create("lost", "b", tone(1.0, 16000), 16000)
    store.close()
    (tmp_path / "audio" / f"{lost.id}.wav").unlink()  # as if the disk lost it
    stray = tmp_path / "audio" / ".voice_x.wav.tmp-1234"  # an interrupted atomic write
    stray.write_bytes(b"partial")
    reopened = VoiceStore(tmp_path)
    assert [v.id for v in reopened.list()] == [kept.id]
    assert not stray.exists()


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "f.bin"
    atomic_write(path, b"old")
    atomic_write(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_shared_store_sees_another_replicas_writes_and_keeps_its_young_temp_files(tmp_path):
    """Two stores on one directory, as two pods on a ReadWriteMany volume: rollback journal, not WAL."""
    a, b = VoiceStore(tmp_path, shared=True), VoiceStore(tmp_path, shared=True)
    assert a._db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    voice = a.create("dora", "shared", tone(1.0, 16000), 16000)
    assert b.find_by_name("DORA") == voice
    with pytest.raises(VoiceExistsError):
        b.create("Dora", "again", tone(1.0, 16000), 16000)
    in_progress = tmp_path / "audio" / ".voice_y.wav.tmp-5678"  # another replica writing right now
    in_progress.write_bytes(b"partial")
    VoiceStore(tmp_path, shared=True)
    assert in_progress.exists()
    assert b.delete(voice.id) and a.get(voice.id) is None
