"""flashtrain.lab.checkout completes an uninstalled checkout: flashtrain.kernels is the top-level
kernels/ folder, found only after every other finder (an installed one wins)."""

from __future__ import annotations

import subprocess
import sys

from flashtrain.lab import checkout


def test_finder_maps_only_flashtrain_kernels_to_the_checkout():
    finder = checkout.CheckoutKernels()
    spec = finder.find_spec("flashtrain.kernels")
    assert spec.origin == str(checkout.KERNELS / "__init__.py")
    assert spec.submodule_search_locations == [str(checkout.KERNELS)]
    assert finder.find_spec("flashtrain.models") is None and finder.find_spec("kernels") is None
    assert isinstance(sys.meta_path[-1], checkout.CheckoutKernels) or any(
        isinstance(f, checkout.CheckoutKernels) for f in sys.meta_path
    )


def test_a_bare_checkout_imports_the_kernels_through_the_lab():
    """A Python that sees only the checkout (no site-packages install of flashtrain): without the
    lab flashtrain.kernels is missing, with it it is the checkout's."""
    code = (
        f"import sys; sys.path[:0] = [{str(checkout.REPO)!r}]\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "import importlib.util as u\n"
        "print(u.find_spec('flashtrain.kernels') is None)\n"
        "import flashtrain.lab, flashtrain.kernels as k\n"
        "print(k.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()
    assert before == "True" and after == str(checkout.KERNELS / "__init__.py")
