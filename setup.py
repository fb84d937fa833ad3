"""The package list, which pyproject.toml cannot say: every package under flashtrain/, plus the
top-level kernels/ folder installed as `flashtrain.kernels` and its Hopper kernels as
`flashtrain.kernels.hopper` (the design keeps the device code at the top level; a top-level
`kernels` package would clash with PyPI's `kernels`).
Everything else about the build is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["flashtrain", "flashtrain.*"]),
        "flashtrain.kernels",
        "flashtrain.kernels.hopper",
    ],
    package_dir={"flashtrain.kernels": "kernels"},
)
