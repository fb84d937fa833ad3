"""The layers import one way: inference -> train -> checkpoint -> hf -> models -> attention ->
kernels, data beside models (it imports neither models nor attention), leaf utilities
(typed_config, file_integrity, no_space, utils, collectives) importable by all, the lab (flashtrain.lab:
tooling that knows the checkout) above everything, its own parts layered too (checkout,
experiments at the bottom; bench; reports; the programs on top), and no import cycle anywhere,
not even through an import inside a function. Every package and every lab part has a layer."""

from __future__ import annotations

import ast
from pathlib import Path

from config_testing import REPO

# layer -> the layers it may import (itself always allowed). A layer is a flashtrain package
# (flashtrain.X) or a part of the lab (flashtrain.lab.X, a subpackage or a module).
LIBRARY = {
    "typed_config": set(),
    "file_integrity": set(),
    "no_space": set(),  # a write refused for want of space (full disk, quota): NoSpaceError
    "utils": set(),
    "collectives": set(),  # broadcast / gather that are no-ops without a process group
    "plots": {"data"},  # matplotlib figures for the reports (lab) and evaluate (inference)
    "kernels": set(),
    "attention": {"kernels", "typed_config"},
    "models": {"attention", "kernels", "typed_config"},
    "data": {"typed_config", "file_integrity", "no_space"},
    # hf: the weight mappings, transformers folders read lazily, from_hf / to_hf, the attention
    # registration; knows nothing of checkpoints or training
    "hf": {"models", "data", "attention", "kernels", "typed_config", "file_integrity", "utils"},
    # checkpoint: weights on disk (read, write, checksums, lock, run info, load_model, the
    # initial weights, export to transformers); hf: sources read through hf's mappings
    "checkpoint": {
        "hf",
        "models",
        "data",
        "attention",
        "kernels",
        "typed_config",
        "file_integrity",
        "no_space",
        "utils",
        "collectives",
    },
    "train": {
        "tasks",
        "plots",
        "checkpoint",
        "models",
        "data",
        "attention",
        "kernels",
        "typed_config",
        "file_integrity",
        "no_space",
        "utils",
        "collectives",
    },
    # after training: sampling and evaluation load models through checkpoint; nothing that
    # knows the checkout (the decode benchmark is lab.bench.decode; evaluate's configs folder
    # comes from its caller); train only for its config schemas (evaluate --data)
    # the retrieval evaluation: grids of the data's retrieval tasks scored on a model, reports
    "tasks": {"models", "data", "plots"},
    "inference": {
        "checkpoint",
        "models",
        "data",
        "train",
        "attention",
        "plots",
        "no_space",
        "tasks",
    },
}
LAB_BASE = set(LIBRARY) | {"lab", "lab.checkout"}  # what every part of the lab may use
ALLOWED = {
    **LIBRARY,
    "lab": {"lab.checkout"},  # flashtrain/lab/__init__.py: completes an uninstalled checkout
    "lab.checkout": set(),
    "lab.experiments": {"lab", "lab.checkout"},
    "lab.bench": LAB_BASE,
    "lab.reports": LAB_BASE | {"lab.experiments", "lab.bench"},
    "lab.reproduce": LAB_BASE | {"lab.experiments", "lab.bench", "lab.reports"},
    "lab.gpu_suite": LAB_BASE | {"lab.bench"},
    # the paper's results in one GPU call: the experiments' gpu-call scale run by the driver's
    # pieces, the trainer's metrics read as the reports read them
    "lab.paper_call": LAB_BASE | {"lab.experiments", "lab.bench", "lab.reports", "lab.reproduce"},
    "lab.prepare_data": LAB_BASE,
    "lab.make_pathfinder": LAB_BASE,
    # the compile tool, and its reading of the main loop's wgmma waits from the PTX
    "lab.ptx_waits": set(),
    "lab.kernel_compile": LAB_BASE | {"lab.ptx_waits"},
    # the PyTorch mirrors of the Gluon kernels' schedules (kernels/hopper), for the CPU tests;
    # the forward's reuses the backward's mbarrier model
    "lab.hopper_bwd_mirror": LAB_BASE,
    "lab.hopper_fwd_mirror": LAB_BASE | {"lab.hopper_bwd_mirror"},
    # the launch contract: kernel_compile's stand-in driver, at the presets' and suite's shapes
    "lab.launch_contract": LAB_BASE | {"lab.kernel_compile", "lab.bench", "lab.gpu_suite"},
}


def _modules() -> dict[str, Path]:
    """{module name: file}; the top-level kernels/ folder is flashtrain.kernels (setup.py maps it)."""
    files = {}
    for root, package in (
        (REPO / "flashtrain", "flashtrain"),
        (REPO / "kernels", "flashtrain.kernels"),
    ):
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = (package, *(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
            files[".".join(parts)] = path
    return files


def _imports(path: Path, name: str, top_level_only: bool) -> set[str]:
    """flashtrain modules imported by the file (module level only, or anywhere)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("flashtrain")}


def _package(module: str) -> str:
    """flashtrain.train.trainer -> "train"; flashtrain.lab.bench.measure -> "lab.bench"."""
    parts = module.split(".")
    if parts[1:2] == ["lab"]:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_layer():
    """A new package (or lab part) must be placed in the layers, not silently skipped."""
    missing = sorted({_package(n) for n in _modules()} - set(ALLOWED) - {""})
    assert not missing, f"add to ALLOWED in {__file__}: {missing}"


def test_no_upward_imports():
    wrong = []
    for name, path in _modules().items():
        layer = _package(name)
        for target in _imports(path, name, top_level_only=False):
            other = _package(target)
            if other and other != layer and other not in ALLOWED[layer]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    """Module level or inside a function: a lazy import that closes a circle only hides it."""
    modules = _modules()
    graph = {
        name: {m for m in _imports(path, name, top_level_only=False) if m in modules and m != name}
        for name, path in modules.items()
    }
    # A package's __init__ importing its submodules, which import from the package, is the
    # normal Python layout, not a cycle: ignore edges from a module to its own parent packages.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node, stack):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*stack, node, nxt]))
            if nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
