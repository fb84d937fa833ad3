"""Every attention test runs on both CPU routes, so a bug cannot hide behind either:
"triton" (the kernels under TRITON_INTERPRET=1) and "torch" (the PyTorch path that CPU calls
take by default without the interpreter: ATen's fused kernel where it is exact, the chunked
path otherwise). The autouse fixture `backend` sets FLASHTRAIN_CPU_ATTENTION for the test.

Opt out with @pytest.mark.single_route (or a module-level pytestmark) for tests that call the
kernels directly, compare the routes themselves, or pick a route on their own; modules named
test_kernel_*.py (kernel internals) are single-route too.
"""

import os

import pytest

ROUTES = ("triton", "torch")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "single_route: run once, not once per CPU attention route (see conftest)"
    )


def _single_route(metafunc) -> bool:
    module = metafunc.module.__name__.rpartition(".")[2]
    return module.startswith("test_kernel_") or (
        metafunc.definition.get_closest_marker("single_route") is not None
    )


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames and not _single_route(metafunc):
        metafunc.parametrize("backend", ROUTES, indirect=True)


@pytest.fixture(autouse=True)
def backend(request, monkeypatch):
    """The CPU route this test runs on, or None for single-route tests (environment untouched)."""
    route = getattr(request, "param", None)
    if route == "triton" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        pytest.skip("the Triton route on CPU tensors needs TRITON_INTERPRET=1 (set without CUDA)")
    if route is not None:
        monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", route)
    return route
