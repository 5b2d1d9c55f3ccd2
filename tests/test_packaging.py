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


def test_make_install_shows_each_stage_and_names_the_cpu_torch(tmp_path):
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    plan = subprocess.run([make, "-n", "install", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MAKEFLAGS": ""})
    assert plan.returncode == 0, plan.stderr
    steps = plan.stdout
    stages = [line for line in steps.splitlines() if "==> [" in line]
    assert [s.split("==> [")[1][:3] for s in stages] == ["1/4", "2/4", "3/4", "4/4"]
    assert "--quiet" not in steps and " -q " not in steps  # pip shows what it does
    torch_line = next(line for line in steps.splitlines() if "torch==" in line)
    assert "torch==2.13.0+cpu" in torch_line  # the CPU build, never PyPI's CUDA one
    assert "download.pytorch.org/whl/cpu" in steps
