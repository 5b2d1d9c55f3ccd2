"""Package layout only (everything else is in pyproject.toml): the repository's rooms install as subpackages
of one top-level name, `pcgtts` (`engine/` -> `pcgtts.engine`, ...), so a user's site-packages gains nothing
that can clash with another `server` or `engine`. Packages are found here, not listed by hand, so a new one
cannot be left out of the wheel; folders of data (the playground's static files, the embedded model under
`models/demo-en`) are found as namespace packages and ship every file they hold."""

from setuptools import find_namespace_packages, setup

ROOMS = ["asg_tables", "bench", "engine", "models", "recipes", "server", "tts"]
NOT_SHIPPED = ["*__pycache__*", "bench.results*"]  # measurements stay in the repository

setup(
    package_dir={"pcgtts": "pcgtts", **{f"pcgtts.{room}": room for room in ROOMS}},
    packages=["pcgtts", *(f"pcgtts.{name}" for name in
                          find_namespace_packages(include=[f"{r}*" for r in ROOMS], exclude=NOT_SHIPPED))],
    package_data={"": ["*"]},
)
