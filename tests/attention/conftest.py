"""Every attention test runs on both CPU routes, so a bug cannot hide behind either:
"triton" (the kernels under TRITON_INTERPRET=1) and "torch" (the PyTorch path that CPU calls
take by default without the interpreter: ATen's fused kernel where it is exact, the chunked
path otherwise). The autouse fixture `route` sets FLASHTRAIN_CPU_ATTENTION for the test.

Opt out with @pytest.mark.single_route (or a module-level `pytestmark`) for tests that call the
kernels directly (kernel internals), compare the routes themselves, or pick a route on their own.
"""

import os

import pytest

from flashtrain.attention.route import ROUTES


def pytest_generate_tests(metafunc):
    if "route" in metafunc.fixturenames and not metafunc.definition.get_closest_marker(
        "single_route"
    ):
        metafunc.parametrize("route", ROUTES, indirect=True)


@pytest.fixture(autouse=True)
def route(request, monkeypatch):
    """The CPU route this test runs on, or None for single-route tests (environment untouched)."""
    chosen = getattr(request, "param", None)
    if chosen == "triton" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        pytest.skip("the Triton route on CPU tensors needs TRITON_INTERPRET=1 (set without CUDA)")
    if chosen is not None:
        monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", chosen)
    return chosen
