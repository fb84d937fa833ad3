"""The wheel installs the kernels as `flashtrain.kernels` and no top-level `kernels` package
(that name belongs to another project on PyPI; installing both must not break either)."""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (path,) = out.glob("flashtrain-*.whl")
    return path


def test_wheel_has_no_top_level_kernels(wheel):
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "kernels" not in tops
    names = zipfile.ZipFile(wheel).namelist()
    assert "flashtrain/kernels/flash_fwd.py" in names and "flashtrain/kernels/flash_bwd.py" in names


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
