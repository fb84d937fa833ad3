"""Keep Python's cyclic garbage collector off what a test process holds for good (a pytest
plugin, tests/conftest.py loads it).

A full collection walks every object the interpreter tracks, and a test worker holds about a
million: torch, transformers, the test modules, and what tests import lazily (wandb, the
inductor, transformers' models). Every Trainer.close collects, and Python does on its own every
few tens of thousands of allocations: ~0.3 s a walk, about a minute of the suite's work on 2
cores. Frozen objects (gc.freeze) are not walked again; refcounting still frees them, and they
are ones that live to the session's end anyway. What the tests create is collected as usual.

- While the test modules import: no automatic collection (each would walk all imported so far,
  for next to no garbage); then one, and everything still alive is frozen.
- At a test module's start, once more than REFREEZE_OBJECTS long-lived objects have piled up
  (lazy imports): a collection, then a freeze. The previous module's fixtures are gone by then.
- At exit, unfrozen: nanobind reports objects still alive at exit as leaks.
"""

import gc

import pytest

REFREEZE_OBJECTS = 50_000


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_earlier_modules_imported():
    if len(gc.get_objects(generation=2)) > REFREEZE_OBJECTS:
        gc.collect()
        gc.freeze()
    yield


def pytest_unconfigure(config):
    gc.unfreeze()
