"""Whether worker processes may start from here.

spawn and forkserver workers (what flashtrain uses: no inherited threads or torch state) import
the calling script as `__mp_main__`. A call made by a statement at the script's top level
without `if __name__ == "__main__":` therefore runs again in every worker, which then waits
forever on the cache lock its parent holds, or starts workers of its own. That is found here
before any process starts, by reading the script: the statement of the main module that is
running now (the bottom of this call's stack) must lie inside such a guard.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` (either operand order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = {ast.unparse(test.left), ast.unparse(test.comparators[0])}
    return sides in ({"__name__", "'__main__'"}, {"__name__", '"__main__"'})


def _guarded_lines(source: str) -> list[tuple[int, int]]:
    """(first, last) line of every `if __name__ == "__main__":` block of a module's source."""
    tree = ast.parse(source)
    return [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if _is_main_guard(n)]


def unguarded_call_site() -> tuple[str, int] | None:
    """(script, line) when this call comes from a statement at the top level of the main script
    outside `if __name__ == "__main__":`; None when it is guarded, or when workers would not
    import a script (python -c, an interactive session, a notebook), or when the statement is
    not found (a call from another thread): then workers may start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:
        return None
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)
    ):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        blocks = _guarded_lines(Path(frame.f_code.co_filename).read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # not readable as Python source: nothing to judge by
    line = frame.f_lineno
    if any(first <= line <= last for first, last in blocks):
        return None
    return frame.f_code.co_filename, line
