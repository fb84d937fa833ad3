"""Make Triton's interpreter skip redundant work on nested device-function calls (tests only).

Under TRITON_INTERPRET=1 a kernel launch patches triton.language with its interpreted builtins
once, then runs every program; but each call of a @triton.jit helper from inside the kernel
patches the same modules again (inspect.getmembers over them: about 1 ms a call, more than the
helper's own work on a small tile). The kernels are written as small helpers (loads, visit
plans, masks) that the compiler inlines on a GPU, so the tests would pay that millisecond on
every tile. What a patch does depends only on the calling function's module namespace (which
triton.language modules it sees), and the launch restores everything at its end; so within one
launch, the first call from each namespace patches and the later ones, which would set the same
attributes again, are skipped. That changes nothing but the time. Likewise the integer
overflow checks that the interpreter computes and then discards (below). Triton versions whose
interpreter is laid out differently are left untouched (the tests are then only slower).
"""

from __future__ import annotations

import dataclasses


def install() -> bool:
    """Wrap the interpreter's patch step; True when installed."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    grid_executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or grid_executor is None or getattr(patch_lang, "_nested_skip", False):
        return False
    # ids of the module namespaces whose triton.language modules this launch has patched
    patched: set[int] | None = None

    def patch_once_per_module(fn):
        if patched is None:  # outside a launch: as Triton does
            return patch_lang(fn)
        if id(fn.__globals__) in patched:
            return None  # the same modules, already patched during this launch
        patched.add(id(fn.__globals__))
        return patch_lang(fn)

    run_launch = grid_executor.__call__

    def launch(self, *args, **kwargs):
        nonlocal patched
        if patched is not None:  # a launch inside a launch: leave it to the outer one
            return run_launch(self, *args, **kwargs)
        patched = set()  # the launch's own patch goes through (it returns the scope restored)
        try:
            return run_launch(self, *args, **kwargs)
        finally:
            patched = None

    patch_once_per_module._nested_skip = True
    interpreter._patch_lang = patch_once_per_module
    grid_executor.__call__ = launch
    _skip_discarded_overflow_checks(interpreter)
    return True


def _skip_discarded_overflow_checks(interpreter) -> None:
    """Every int32 +, -, * in a kernel is also computed in int64 and compared with the int32
    range for an overflow assert, which the interpreter then drops unless debug is on (Triton's
    device_assert returns early): whole-tile work per index expression, for nothing."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if (
        options is None
        or getattr(options, "debug", True)
        or not hasattr(options, "sanitize_overflow")
    ):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
