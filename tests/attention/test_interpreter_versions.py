"""The interpreter of triton < 3.7 under numpy >= 2.4 (flashtrain.kernels.interpreter_compat):
the rule on version numbers, that it agrees with the installed interpreter, the backport of
3.7's __index__, and the one-line refusal where no backport can be made. Runs under any triton:
versions and the interpreter's function are monkeypatched, never installed."""

from __future__ import annotations

import operator
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from triton.runtime import interpreter

from flashtrain.attention import flash_attn_func
from flashtrain.attention.route import route_for
from flashtrain.kernels import interpreter_compat
from flashtrain.kernels.interpreter_compat import installed_versions, interpreter_problem

pytestmark = pytest.mark.single_route
ON_CPU = torch.empty(0)  # route_for takes an operand: a float32 CPU tensor


@pytest.mark.parametrize(
    "triton_version, numpy_version, broken",
    [
        ("3.6.0", "2.4.0", True),
        ("3.6.0", "2.5.1", True),
        ("3.2.0", "2.4.6", True),
        ("3.6.0+git9844da95", "2.5.0rc1", True),  # local and pre-release builds: their release
        ("3.6.0", "3.0.0", True),
        ("3.6.0", "2.3.5", False),
        ("3.5.1", "1.26.4", False),
        ("3.7.0", "2.5.0", False),
        ("3.7.0+gitabc", "2.4.0", False),
        ("3.9.0", "2.4.6", False),
        ("4.0.0", "2.5.0", False),
    ],
)
def test_rule(triton_version, numpy_version, broken):
    problem = interpreter_problem(triton_version, numpy_version)
    assert (problem is not None) == broken
    if broken:
        assert "\n" not in problem
        for part in (triton_version, numpy_version, "numpy<2.4", "triton>=3.7"):
            assert part in problem
        assert "FLASHTRAIN_CPU_ATTENTION=torch" in problem


def test_rule_rejects_what_is_not_a_version():
    with pytest.raises(ValueError, match="not a release version"):
        interpreter_problem("main", "2.4.0")


def _index_of_one_element(patch_lang_tensor, value: int) -> int:
    """operator.index of a scalar as the interpreter holds it (a 1-element 1-d array), on a
    stand-in tensor class given the methods `patch_lang_tensor` sets for a launch."""

    class Tensor:
        pass

    scope = getattr(interpreter, "_LangPatchScope", None)  # triton >= 3.6 passes one
    patch_lang_tensor(Tensor, *([scope()] if scope else []))
    tensor = Tensor()
    tensor.handle = SimpleNamespace(data=np.array([value], dtype=np.int32))
    return operator.index(tensor)


def test_rule_agrees_with_the_installed_interpreter():
    """The interpreter's own __index__ (unwrapped, should the backport be in place) fails on a
    1-element array exactly where the rule says so."""
    own = interpreter._patch_lang_tensor
    own = getattr(own, "__wrapped__", own)
    problem = interpreter_problem(*installed_versions())
    if problem is None:
        assert _index_of_one_element(own, 7) == 7
    else:
        with pytest.raises(TypeError, match="0-dimensional"):
            _index_of_one_element(own, 7)


def _triton_3_6_patch_lang_tensor(tensor, scope=None):
    """triton 3.6's __index__ line (triton/runtime/interpreter.py, _patch_lang_tensor)."""
    index = lambda self: int(self.handle.data)
    if scope is None:
        tensor.__index__ = index
    else:
        scope.set_attr(tensor, "__index__", index)


@pytest.fixture
def old_triton(monkeypatch):
    """This process as triton 3.6.0 with numpy 2.5.0 under TRITON_INTERPRET=1."""
    monkeypatch.setattr(interpreter_compat, "installed_versions", lambda: ("3.6.0", "2.5.0"))
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", _triton_3_6_patch_lang_tensor)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "auto")


def test_the_route_backports_the_squeeze(old_triton):
    if interpreter_problem(*installed_versions()) is not None:  # the real numpy is strict
        with pytest.raises(TypeError):
            _index_of_one_element(_triton_3_6_patch_lang_tensor, 5)
    assert route_for(ON_CPU) == "triton"
    backported = interpreter._patch_lang_tensor
    assert backported.__wrapped__ is _triton_3_6_patch_lang_tensor
    assert _index_of_one_element(backported, 5) == 5
    route_for(ON_CPU)  # once is enough: a second route wraps nothing more
    assert interpreter._patch_lang_tensor is backported


def test_the_route_refuses_in_one_line_where_no_backport_can_be_made(old_triton, monkeypatch):
    monkeypatch.delattr(interpreter, "_patch_lang_tensor")
    line = interpreter_problem("3.6.0", "2.5.0")
    with pytest.raises(RuntimeError) as refused:
        route_for(ON_CPU)
    assert str(refused.value) == line
    q = torch.randn(1, 16, 1, 16)
    with pytest.raises(RuntimeError, match="triton 3.6.0 fails with numpy 2.5.0"):
        flash_attn_func(q, q, q)


@pytest.mark.parametrize("env", [{"FLASHTRAIN_CPU_ATTENTION": "torch"}, {"TRITON_INTERPRET": "0"}])
def test_the_pytorch_path_needs_no_interpreter(old_triton, monkeypatch, env):
    monkeypatch.delattr(interpreter, "_patch_lang_tensor")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert route_for(ON_CPU) == "torch"


def test_fitting_versions_leave_the_interpreter_alone(old_triton, monkeypatch):
    monkeypatch.setattr(interpreter_compat, "installed_versions", lambda: ("3.7.0", "2.5.0"))
    assert route_for(ON_CPU) == "triton"
    assert interpreter._patch_lang_tensor is _triton_3_6_patch_lang_tensor
