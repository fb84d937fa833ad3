"""Every attention test runs on both CPU routes, so a bug cannot hide behind either:
"triton" (the kernels under TRITON_INTERPRET=1) and "torch" (the PyTorch path that CPU calls
take by default without the interpreter: ATen's fused kernel where it is exact, the chunked
path otherwise). The autouse fixture `route` sets FLASHTRAIN_CPU_ATTENTION for the test.

Opt out with @pytest.mark.single_route (or a module-level `pytestmark`) for tests that call the
kernels directly (kernel internals), compare the routes themselves, or pick a route on their own.

The forward's Hopper variants (kernels/tuning.py TileConfig.warp_specialize, .persistent) are
a second pass over the same tests: with FLASHTRAIN_TEST_FORWARD_VARIANT=ws, persistent or
ws+persistent, every test of this directory runs with the forward launched as that variant at
the interpreter's tiles (descriptor loads: the warp-specialized loop needs them), and the
route-parametrized ones on the Triton route only:

    FLASHTRAIN_TEST_FORWARD_VARIANT=ws+persistent pytest tests/attention

Tests marked @pytest.mark.config_choice (which config a launch gets) are skipped there. The
normal suite checks each variant in test_kernel_variants.py.
"""

import os

import pytest

from flashtrain.attention.route import ROUTES
from flashtrain.kernels import tuning
from flashtrain.kernels.tuning import TileConfig

VARIANT_ENV = "FLASHTRAIN_TEST_FORWARD_VARIANT"
_VARIANT_FLAGS = {
    "ws": dict(warp_specialize=True),
    "persistent": dict(persistent=True),
    "ws+persistent": dict(warp_specialize=True, persistent=True),
}


def forward_variant() -> TileConfig | None:
    """The forward config of the variant pass (None: the normal run)."""
    name = os.environ.get(VARIANT_ENV, "")
    if not name:
        return None
    if name not in _VARIANT_FLAGS:
        raise pytest.UsageError(f"{VARIANT_ENV}={name!r}; allowed: {', '.join(_VARIANT_FLAGS)}")
    return TileConfig(32, 16, 0, 4, 1, tma=True, **_VARIANT_FLAGS[name])


@pytest.fixture(autouse=True)
def forward_variant_pass(request):
    """The variant pass's forward config around every test (see the module docstring)."""
    variant = forward_variant()
    if variant is None:
        yield None
        return
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        pytest.skip(f"{VARIANT_ENV} runs the kernels under TRITON_INTERPRET=1")
    if request.node.get_closest_marker("config_choice"):
        pytest.skip(f"checks which config a launch gets, which {VARIANT_ENV} forces")
    with tuning.overridden("fwd", variant):
        yield variant


def pytest_generate_tests(metafunc):
    if "route" in metafunc.fixturenames and not metafunc.definition.get_closest_marker(
        "single_route"
    ):
        routes = ("triton",) if forward_variant() else ROUTES
        metafunc.parametrize("route", routes, indirect=True)


@pytest.fixture(autouse=True)
def route(request, monkeypatch):
    """The CPU route this test runs on, or None for single-route tests (environment untouched)."""
    chosen = getattr(request, "param", None)
    if chosen == "triton" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        pytest.skip("the Triton route on CPU tensors needs TRITON_INTERPRET=1 (set without CUDA)")
    if chosen is not None:
        monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", chosen)
    return chosen


@pytest.fixture
def hopper(monkeypatch):
    """The compile check's stand-in for the route tests: a Hopper GPU, the kernels compiled (not
    interpreted); kernels/hopper/route.py then decides on the call alone."""
    monkeypatch.setattr(tuning, "interpreted", lambda: False)
    monkeypatch.setattr(tuning, "gpu_capability", lambda device: (9, 0))
