"""Both engines behind the TTS service provide every member of the streaming interface it drives
(engine/streaming.py), and the service reads nothing else of an engine."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
from pcgtts.engine.async_engine import AsyncEngine
from pcgtts.engine.streaming import StreamingEngine

ROOT = Path(__file__).resolve().parents[2]


def interface_members() -> set[str]:
    annotated = set(inspect.get_annotations(StreamingEngine))
    defined = {name for name, _ in inspect.getmembers(StreamingEngine) if not name.startswith("_")}
    return annotated | defined


def provided(cls: type) -> set[str]:
    """Class-level members and the attributes its __init__ assigns to self."""
    names = {name for name, _ in inspect.getmembers(cls)}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


@pytest.mark.parametrize("module, name", [("pcgtts.engine.async_engine", "AsyncEngine"),
                                          ("pcgtts.engine.vllm.engine", "VllmEngine")])
def test_each_engine_provides_the_whole_interface(module, name):
    import importlib

    cls = getattr(importlib.import_module(module), name)  # importing VllmEngine needs no vLLM
    missing = interface_members() - provided(cls)
    assert not missing, f"{name} lacks {sorted(missing)}"


def test_the_service_uses_only_the_interface_of_its_engine():
    tree = ast.parse((ROOT / "tts" / "service.py").read_text())
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "engine" and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"}
    assert used and used <= interface_members(), sorted(used - interface_members())
    assert AsyncEngine.name == "builtin"
