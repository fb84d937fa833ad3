"""The wheel and an editable install both give the top-level kernels/ folder as
`flashtrain.kernels` (setup.py's package-dir mapping, no link in the tree) and no top-level
`kernels` package (that name belongs to another project on PyPI; installing both must not break
either)."""

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of the sources: an in-tree build would reuse the checkout's stale build/
    # folder, so a package the build no longer lists could still reach the wheel.
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("flashtrain", "kernels"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (path,) = out.glob("flashtrain-*.whl")
    return path


def test_wheel_has_no_top_level_kernels(wheel):
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "kernels" not in tops
    names = zipfile.ZipFile(wheel).namelist()
    assert "flashtrain/kernels/flash_fwd.py" in names and "flashtrain/kernels/flash_bwd.py" in names


def test_wheel_holds_every_package_of_the_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = [p.parent for p in (ROOT / "flashtrain").rglob("__init__.py")]
    missing = [
        str(p.relative_to(ROOT))
        for p in packages
        if f"{p.relative_to(ROOT)}/__init__.py" not in names
    ]
    assert not missing, f"packages left out of the wheel: {missing}"
    assert not (ROOT / "flashtrain" / "kernels").exists(), "flashtrain/kernels must not be a link"


def test_installed_wheel_imports_kernels_under_flashtrain(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    # -S: no site processing, so the development checkout's editable hook is not loaded; the
    # dependencies (torch, triton) come from this environment's site-packages, after the wheel.
    code = (
        "import flashtrain, flashtrain.kernels.flash_fwd, flashtrain.kernels.flash_bwd\n"
        "import importlib.util\n"
        f"assert flashtrain.__file__.startswith({str(target)!r}), flashtrain.__file__\n"
        "assert importlib.util.find_spec('kernels') is None\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_editable_install_maps_kernels_to_the_checkout(tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--ignore-installed", "--prefix", str(prefix), "-e", str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    site_dir = sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["purelib"]
    # -S, then the prefix as a site directory: its .pth (the editable finder) is the only way to
    # the checkout; the dependencies come from this environment's site-packages.
    code = (
        "import site, sys\n"
        f"site.addsitedir({site_dir!r})\n"
        f"sys.path.append({sysconfig.get_paths()['purelib']!r})\n"
        "import importlib.util\n"
        "import flashtrain, flashtrain.kernels.flash_fwd as fwd\n"
        "print(flashtrain.__file__)\n"
        "print(fwd.__file__)\n"
        "print(importlib.util.find_spec('kernels') is None)\n"
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    package, kernel, no_top_level = run.stdout.split()
    assert package == str(ROOT / "flashtrain" / "__init__.py")
    assert kernel == str(ROOT / "kernels" / "flash_fwd.py")  # the checkout's file, not a copy
    assert no_top_level == "True"
