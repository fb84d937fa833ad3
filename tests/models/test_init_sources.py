"""model.init_from's sources by prefix: the models never import the packages that load them."""

import pytest

from flashtrain.models import init_sources


def test_a_known_prefix_without_its_package_names_the_import(monkeypatch):
    monkeypatch.setattr(init_sources, "INIT_SOURCES", {})
    with pytest.raises(ValueError, match=r"registered by flashtrain\.hf .*import flashtrain\.hf"):
        init_sources.init_source_for("hf:gpt2")
    assert init_sources.init_source_for("/runs/a/checkpoints/step_000010/model.pt") is None


def test_a_registered_prefix_is_used(monkeypatch):
    monkeypatch.setattr(init_sources, "INIT_SOURCES", {})
    load = lambda ref, model: {"ref": ref}
    init_sources.register_init_source("hf:", load)
    assert init_sources.init_source_for("hf:gpt2") is load
