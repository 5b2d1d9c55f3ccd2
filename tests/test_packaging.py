"""Packaging and first-run install: metadata builds without setuptools warnings, and `make install` shows
each stage and installs the CPU build of torch explicitly (checked on the Makefile's dry run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())


def test_package_metadata_builds_without_warnings(tmp_path):
    """setuptools turns deprecated pyproject fields (e.g. a license table) into warnings: here, errors."""
    code = ("import sys, warnings; warnings.simplefilter('error'); from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    metadata = (tmp_path / done.stdout.split()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata


def _make_plan(target: str, venv: Path, **env: str) -> str:
    """What `make -n TARGET` would run for a fresh VENV (the commands, echo lines included)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PCGTTS_")}
    plan = subprocess.run([make, "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, "MAKEFLAGS": "", **env})
    assert plan.returncode == 0, plan.stderr
    return plan.stdout


def _pip_installs(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if "/bin/pip install" in line]


def test_make_install_shows_each_stage_and_names_the_cpu_torch(tmp_path):
    steps = _make_plan("install", tmp_path / "venv")
    stages = [line for line in steps.splitlines() if "==> [" in line]
    assert [s.split("==> [")[1][:3] for s in stages] == ["1/4", "2/4", "3/4", "4/4"]
    assert "--quiet" not in steps and " -q " not in steps  # pip shows what it does
    torch_line = next(line for line in steps.splitlines() if "torch==" in line)
    assert "torch==2.13.0+cpu" in torch_line  # the CPU build, never PyPI's CUDA one
    assert "download.pytorch.org/whl/cpu" in steps


def test_make_serve_installs_what_serves_and_make_test_adds_the_test_tools(tmp_path):
    """DESIGN's set-up contract: `make install` (and so `make serve`) installs the runtime only; `make test`
    adds the test tools and the optional extras its tests exercise. Every pip run of either is announced by
    a stage line of its own, and none is quiet, so the install never goes silent."""
    venv = tmp_path / "venv"
    serve = _make_plan("serve", venv)
    assert _pip_installs(serve) and not any("[" in line for line in _pip_installs(serve)), serve
    assert "-e ." in serve
    test = _make_plan("test", venv)
    extras = " ".join(_pip_installs(test))
    assert "'.[test]'" in extras and "'.[xcodec2]'" in extras, test
    lines = test.splitlines()
    for i, line in enumerate(lines):
        if "/bin/pip install" in line and not line.strip().startswith("||"):  # not a fallback of the same run
            stage = next(lines[j] for j in range(i - 1, -1, -1) if "/bin/pip install" in lines[j]
                         or "==> [" in lines[j])
            assert "==> [" in stage, f"no stage line announces: {line}"
            assert "--quiet" not in line and " -q " not in line, line


def test_the_installer_names_the_url_make_serve_will_listen_on(tmp_path):
    """The last line of the install says what to open next: PCGTTS_PORT (and a host other than a wildcard)
    as `make serve` will use them."""
    venv = tmp_path / "venv"
    assert "next: make serve (http://127.0.0.1:8000/)" in _make_plan("install", venv)
    assert "next: make serve (http://127.0.0.1:9137/)" in _make_plan("install", venv, PCGTTS_PORT="9137")
    wildcard = _make_plan("install", venv, PCGTTS_PORT="9137", PCGTTS_HOST="0.0.0.0")
    assert "(http://127.0.0.1:9137/)" in wildcard
    assert "(http://10.1.2.3:8000/)" in _make_plan("install", venv, PCGTTS_HOST="10.1.2.3")


def _wheel(source: Path, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("*.whl"))


def test_installs_one_top_level_name_beside_another_server_package(tmp_path):
    """`pip install .` into a fresh environment that already holds a top-level `server` package: the wheel
    adds only `pcgtts` (the rooms are its subpackages, the embedded model its data), the other `server`
    still imports, and the installed `pcgtts serve` loads the embedded model and answers /ready."""
    import zipfile

    from server_support import serve_process

    other = tmp_path / "other"
    (other / "server").mkdir(parents=True)
    (other / "server" / "__init__.py").write_text("WHO = 'somebody else'\n")
    (other / "pyproject.toml").write_text('[project]\nname = "other-server"\nversion = "1.0"\n'
                                          '[tool.setuptools]\npackages = ["server"]\n')
    ours = _wheel(ROOT, tmp_path / "our-wheel")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(ours).namelist()}
    assert top_level == {"pcgtts", ours.name.split("-")[0] + "-0.1.0.dist-info"}, top_level

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the other `server` first: it is already there when pcgtts arrives
    for wheel in (_wheel(other, tmp_path / "other-wheel"), ours):
        done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                               "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    # pcgtts's own dependencies (torch, fastapi, ...) from this environment, added after pip has run so
    # that pip never sees this environment's editable pcgtts
    import sysconfig
    (Path(purelib) / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = ("import server, pcgtts.server, pcgtts.engine, pcgtts.models; "
             "print(server.WHO); print(pcgtts.server.__file__); print(pcgtts.models.__file__)")
    done = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    who, server_file, models_file = done.stdout.split("\n")[:3]
    assert who == "somebody else"
    assert server_file.startswith(purelib) and models_file.startswith(purelib)  # not this checkout
    assert (Path(models_file).parent / "demo-en" / "target" / "model.safetensors").is_file()

    env = {"PCGTTS_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": ""}
    with serve_process(env, command=[str(venv / "bin" / "pcgtts")], cwd=tmp_path) as url:
        import httpx

        models = httpx.get(url + "/v1/models", timeout=10)
        assert models.status_code == 200, models.text
