"""The layers import only downwards: server -> tts (its public API) -> engine (+ asg_tables).

Every import statement counts, also those inside functions (lazy imports are still dependencies). The rooms
are folders at the repository's top (`engine/`) installed as `pcgtts.<room>` (setup.py), so a file's
package is `pcgtts.` + its folder, and only `pcgtts.`-prefixed imports name them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PREFIX = "pcgtts."
# room -> (modules it must not import, or "name." for every submodule of name; why)
FORBIDDEN = {
    "server": (("pcgtts.engine", "pcgtts.tts."), "the server uses the TTS service through `pcgtts.tts`"),
    "tts": (("pcgtts.server",), "the TTS service knows nothing of HTTP"),
    "engine": (("pcgtts.server", "pcgtts.tts"), "the engine knows nothing of the service or the server"),
    "asg_tables": (("pcgtts.server", "pcgtts.tts"), "ASG tables are a library under the engine"),
}


def is_module(root: Path, name: str) -> bool:
    """Whether `pcgtts.room.x` names a module or package of the room's folder `room/x`."""
    if not name.startswith(PREFIX):
        return False
    path = root.joinpath(*name.removeprefix(PREFIX).split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file; relative imports are resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = ["pcgtts", *path.relative_to(root).parent.parts]  # the file's package
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                base = ".".join([*anchor, *([base] if base else [])])
            # `from x import y` imports the submodule x.y when there is one
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names
                                              if is_module(root, f"{base}.{a.name}")]
    return found


def violates(module: str, forbidden: str) -> bool:
    if forbidden.endswith("."):
        return module.startswith(forbidden)
    return module == forbidden or module.startswith(forbidden + ".")


def layer_violations(root: Path) -> list[str]:
    out = []
    for package, (forbidden, why) in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, module in imported_modules(path, root):
                for bad in forbidden:
                    if violates(module, bad):
                        out.append(f"{path.relative_to(root)}:{line} imports {module} ({why})")
    return sorted(set(out))


def bare_room_imports(root: Path) -> list[str]:
    """Imports that name a room by its folder (`engine.x`) instead of its installed name (`pcgtts.engine.x`):
    outside a source checkout no such module exists, or it is somebody else's."""
    rooms = [*FORBIDDEN, "bench", "recipes", "models"]
    out = []
    for path in sorted(p for folder in [*rooms, "pcgtts", "tests"] for p in (root / folder).rglob("*.py")):
        for line, module in imported_modules(path, root):
            if module.split(".")[0] in rooms:
                out.append(f"{path.relative_to(root)}:{line} imports {module}")
    return out


def test_rooms_are_imported_by_their_installed_name(tmp_path):
    assert bare_room_imports(ROOT) == []
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/t.py").write_text("from engine.config import EngineConfig\nimport pcgtts.tts\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench/b.py").write_text("def f():\n    import recipes.cli\n")
    assert bare_room_imports(tmp_path) == ["bench/b.py:2 imports recipes.cli",
                                           "tests/t.py:1 imports engine.config"]


def test_layers_import_only_downwards():
    assert layer_violations(ROOT) == []


def test_the_check_finds_violations(tmp_path):
    files = {
        "server/ok.py": "from pcgtts.tts import TTSService\nimport fastapi\nimport server\n",
        "server/internal.py": "from pcgtts.tts.service import TTSService\n",
        "server/engine_use.py": "def f():\n    from pcgtts.engine.config import EngineConfig\n",
        "server/sub/rel.py": "from ...engine import Engine\n",
        "tts/ok.py": "from pcgtts.engine.speech.base import VoicePrompt\n",
        "tts/up.py": "import pcgtts.server.app\n",
        "engine/ok.py": ("from pcgtts.engine.acceptance import make_rule\n"
                         "from pcgtts.asg_tables import ASGTable\n"),
        "engine/sub/up.py": "from .. import sampling\nfrom pcgtts.tts import TTSService\n",
        "engine/lazy.py": "class A:\n    def m(self):\n        import pcgtts.server\n",
        "asg_tables/up.py": "from pcgtts.tts.bundle import ModelBundle\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = layer_violations(tmp_path)
    flagged = {v.split(":")[0] for v in found}
    assert flagged == {"server/internal.py", "server/engine_use.py", "server/sub/rel.py", "tts/up.py",
                       "engine/sub/up.py", "engine/lazy.py", "asg_tables/up.py"}, found
    assert any("engine/sub/up.py:2 imports pcgtts.tts" in v for v in found)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return "pcgtts." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_circles(root: Path, room: str) -> list[list[str]]:
    """Circles of imports between the room's modules (TYPE_CHECKING ones too: a reader follows them as well).
    A module importing a package that holds it is not counted: the package's __init__ re-exporting its
    modules is the usual shape, not a circle between two modules' designs."""
    graph = {}
    for path in sorted((root / room).rglob("*.py")):
        name = module_name(path, root)
        graph[name] = {m for _, m in imported_modules(path, root)
                       if m.startswith(f"{PREFIX}{room}") and not name.startswith(m + ".") and m != name}
    circles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node] & graph.keys()):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt):] + [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [])
    return circles


def test_no_module_imports_itself_in_a_circle(tmp_path):
    assert {room: import_circles(ROOT, room) for room in FORBIDDEN} == {room: [] for room in FORBIDDEN}
    (tmp_path / "tts").mkdir()
    (tmp_path / "tts/__init__.py").write_text("from pcgtts.tts.a import A\n")
    (tmp_path / "tts/a.py").write_text("import pcgtts.tts\nfrom pcgtts.tts.b import B\n")
    (tmp_path / "tts/b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from pcgtts.tts.a import A\n")
    assert import_circles(tmp_path, "tts") == [["pcgtts.tts.a", "pcgtts.tts.b", "pcgtts.tts.a"]]
