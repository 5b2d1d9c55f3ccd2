"""The real `xcodec2` package with random weights: reduced codec and semantic-model directories.

Locally, tests skip without the optional package (`make install-xcodec2`); where
PCGTTS_REQUIRE_SYSTEM_TESTS=1 (CI, whose `make test` installs it) a missing package fails them instead.
"""

from __future__ import annotations

from pathlib import Path

from system_support import require_package


def require_xcodec2() -> None:
    require_package("xcodec2", "the optional xcodec2 package", "make install-xcodec2")


def build_codec_dirs(root: Path) -> tuple[Path, Path]:
    """-> (codec dir, semantic model dir), reduced sizes (engine.codec.xcodec2.synthetic)."""
    from pcgtts.engine.codec.xcodec2.synthetic import save_random_codec, save_random_semantic

    return save_random_codec(root / "xcodec2", seed=1), save_random_semantic(root / "w2v-bert", seed=2)
