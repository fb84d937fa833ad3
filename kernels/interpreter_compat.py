"""The Triton interpreter (TRITON_INTERPRET=1) of triton < 3.7 under numpy >= 2.4.

NumPy 2.4 turned int() of an array with ndim > 0 into a TypeError (deprecated since 1.25). The
interpreter holds every scalar as a 1-element 1-d array, and up to triton 3.6 its
_patch_lang_tensor (triton/runtime/interpreter.py) gives tl.tensor
    __index__ = lambda self: int(self.handle.data)
so every loop over a runtime bound, `for t in range(n)`, which all the kernels here have, fails
with "only 0-dimensional arrays can be converted to Python scalars". triton 3.7.0 squeezes the
array first (triton-lang/triton#9171, int(self.handle.data.squeeze())); 3.2 to 3.6 all have
the old line, in a _patch_lang_tensor(tensor) or _patch_lang_tensor(tensor, scope).

prepare_interpreter, called where an interpreted launch is decided, backports that one line to
an affected triton (the interpreter then does what 3.7's does), and where it cannot (no
_patch_lang_tensor to wrap), refuses with one line that says what to install.
"""

from __future__ import annotations

import functools
import os
import re

FIXED_TRITON = (3, 7)  # the first triton whose interpreter squeezes before int()
STRICT_NUMPY = (2, 4)  # the first numpy whose int() refuses an array with ndim > 0


def _release(version: str) -> tuple[int, int]:
    """(major, minor): '3.6.0+git1a2b3c' -> (3, 6), '2.5.0rc1' -> (2, 5)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    return int(match[1]), int(match[2])


def interpreter_problem(triton_version: str, numpy_version: str) -> str | None:
    """The one line saying why this triton's interpreter fails under this numpy, or None."""
    if _release(triton_version) >= FIXED_TRITON or _release(numpy_version) < STRICT_NUMPY:
        return None
    return (
        f"the Triton interpreter of triton {triton_version} fails with numpy {numpy_version} "
        "(int() of a 1-element array, numpy >= 2.4): install numpy<2.4 or triton>=3.7, or run "
        "the PyTorch paths (FLASHTRAIN_CPU_ATTENTION=torch, or TRITON_INTERPRET unset)"
    )


def installed_versions() -> tuple[str, str]:
    """(triton, numpy) versions of this process."""
    import numpy
    import triton

    return triton.__version__, numpy.__version__


def prepare_interpreter() -> None:
    """Under TRITON_INTERPRET=1: backport triton 3.7's __index__ where the installed versions
    need it; RuntimeError (the problem's line) where that cannot be done. Else nothing."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    problem = interpreter_problem(*installed_versions())
    if problem is not None and not _backport_index_squeeze():
        raise RuntimeError(problem)


def _squeezed_index(self) -> int:
    return int(self.handle.data.squeeze())


def _backport_index_squeeze() -> bool:
    """Wrap the interpreter's _patch_lang_tensor so that after it has set tl.tensor's methods
    for a launch, __index__ is 3.7's. False when there is no such function to wrap."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:
        return False
    if getattr(patch, "squeezes_index", False):
        return True

    @functools.wraps(patch)  # __wrapped__: the interpreter's own, for the tests
    def patch_then_squeeze(tensor, *scope):
        patch(tensor, *scope)
        if scope:  # 3.6: the launch's scope restores the original when the launch ends
            scope[0].set_attr(tensor, "__index__", _squeezed_index)
        else:  # up to 3.5 the interpreter sets its methods for good; so does this
            tensor.__index__ = _squeezed_index

    patch_then_squeeze.squeezes_index = True
    interpreter._patch_lang_tensor = patch_then_squeeze
    return True
