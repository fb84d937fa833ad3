"""FSDP2 on CPU (gloo, two ranks): a model built on the meta device, sharded while still on meta, then
materialised shard by shard (flashtrain.checkpoint.initial_weights): fresh, or read from a trainer
checkpoint ("torch" and "dcp") or a transformers folder (sharded safetensors).

On every rank: fully_shard received meta parameters; the anonymous memory the process holds
(polled while initial_weights runs) grows by no more than its shards plus one block; it reads the
rows of its shards and nothing else (the safetensors reads counted at the file); the gathered
weights equal the source's exactly, and fresh ones have the configured spread with no two ranks'
shards alike. The trainer itself is checked to shard before any weight exists.

The ranks fork from tests/spawn_testing.py's forkserver (torch and the models imported once, not
once per rank); each sets glibc's mmap threshold itself, since the server's environment is
whatever it started with."""

from __future__ import annotations

import ctypes
import gc
import json
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from spawn_testing import run_ranks

from flashtrain.checkpoint import initial_weights
from flashtrain.checkpoint.write import save_checkpoint
from flashtrain.file_integrity import READ_CHUNK
from flashtrain.hf.registry import mapping_for
from flashtrain.models import build_model
from flashtrain.models.materialize import held_rows

WORLD = 2
# ~77 MB of fp32 weights: a rank's half plus one block (~3 MB) is well below the whole model;
# the vocabulary and positions do not split evenly over the ranks
BIG_GPT2 = dict(arch="gpt2", n_layer=24, n_head=4, d_model=256, vocab_size=4099, max_seq_len=65)
SLACK = 8 * 2**20  # the allocator's and the interpreter's own churn
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter, as MALLOC_MMAP_THRESHOLD_ sets it


def _map_large_blocks_one_by_one() -> None:
    """glibc hands every block of 64 KiB or more to the OS and back (a fixed threshold: no reuse
    of the previous source's freed model), so each source's growth is its own."""
    if ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 2**16) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")


def _anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class _PeakAnon:
    """The highest anonymous resident memory seen while the block runs (polled each 0.5 ms)."""

    def __enter__(self):
        self.peak, self._stop = _anon_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _anon_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _anon_bytes())


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same random weights as a trainer checkpoint in both formats and as a transformers
    folder of two safetensors shards; want.pt holds them."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(1)
    with torch.device("meta"):
        model = build_model(BIG_GPT2, "sdpa")
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.02)  # not the init's: a fresh model cannot pass for them
    state = model.state_dict()
    torch.save(state, root / "want.pt")
    config = OmegaConf.to_yaml({"model": BIG_GPT2, "attention": {"impl": "sdpa"}})
    for fmt, sharded in (("torch", False), ("dcp", True)):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            save_checkpoint(
                root / fmt / "checkpoints", 5, model=model, optimizer=torch.optim.SGD(model.parameters()),
                trainer_state={"step": 5}, meta={"model_config": BIG_GPT2}, config_yaml=config,
                sharded=sharded,
            )  # fmt: skip
    mapping = mapping_for(model.config)
    hf = mapping.state_to_hf(state, model.config)
    hf = {
        k: v.contiguous() for k, v in hf.items() if k != "lm_head.weight"
    }  # stored tied, as GPT-2
    folder = root / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(mapping.hf_config(model.config)))
    keys = sorted(hf)
    halves = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    for name, part in halves.items():
        save_file({k: hf[k] for k in part}, str(folder / name))
    index = {"weight_map": {k: name for name, part in halves.items() for k in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def _rank(rank: int, world: int, root: str) -> None:
    _map_large_blocks_one_by_one()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from flashtrain.hf import source as hf_source

    read_at_file = [0]  # elements the safetensors views returned
    getitem = hf_source.SafetensorsView.__getitem__

    def counted(self, index):
        out = getitem(self, index)
        read_at_file[0] += out.numel()
        return out

    hf_source.SafetensorsView.__getitem__ = counted
    root = Path(root)
    want = torch.load(root / "want.pt", mmap=True)  # file pages, not anonymous memory
    mesh = init_device_mesh("cpu", (world,))
    results = {}
    refs = {"fresh": None, "torch": str(root / "torch"), "dcp": str(root / "dcp"),
            "hf": f"hf:{root / 'hf'}"}  # fmt: skip
    for name, ref in refs.items():
        torch.manual_seed(7)
        with torch.device("meta"):
            model = build_model(BIG_GPT2, "sdpa")
        got_meta = all(p.is_meta for p in model.parameters())
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        gc.collect()
        before, read_at_file[0] = _anon_bytes(), 0
        started = time.perf_counter()
        with _PeakAnon() as peak:
            report = initial_weights(model, ref, device="cpu")
        seconds = time.perf_counter() - started
        shard = sum(p.to_local().numel() for p in model.parameters())
        block = sum(p.numel() for p in model.blocks[0].parameters())
        results[name] = dict(
            meta=got_meta, grew=peak.peak - before, shard=4 * shard, block=4 * block,
            whole=4 * sum(p.numel() for p in model.parameters()),
            read=report.elements_read if report else 0, elements=shard, at_file=read_at_file[0],
            seconds=seconds,
        )  # fmt: skip
        firsts = [torch.empty(0)] * world  # every rank's first rows of c_fc: no two alike
        local = model.blocks[0].mlp.c_fc.weight.to_local()[:1].contiguous()
        dist.all_gather_object(firsts, local)
        params = dict(model.named_parameters())
        if ref is None:  # the spread of the whole tensors, from every rank's sums
            spread = {}
            for k in ("wte.weight", "blocks.0.mlp.c_fc.weight", "blocks.0.mlp.c_proj.weight"):
                held = params[k].to_local().double()
                sums = torch.stack([held.sum(), (held**2).sum()])
                dist.all_reduce(sums)
                n = params[k].numel()
                spread[k] = float((sums[1] / n - (sums[0] / n) ** 2).sqrt())
            results[name]["std"] = spread
            results[name]["distinct"] = all(not torch.equal(firsts[0], o) for o in firsts[1:])
        else:  # each rank's rows against the same rows of the weights saved
            results[name]["differ"] = [
                k for k, p in params.items()
                if not torch.equal(p.to_local(), want[k][slice(*held_rows(p))])
            ]  # fmt: skip
        del model, params
    (root / f"rank{rank}.json").write_text(json.dumps(results))


def test_the_trainer_shards_the_model_before_any_weight_exists(tmp_path, monkeypatch):
    """The Trainer's own build under FSDP2 (one process, its one-rank group: the order does not
    depend on the world size): every fully_shard call gets a module whose parameters are all
    still on the meta device, and the weights exist afterwards."""
    import torch.distributed.fsdp as fsdp
    from config_testing import compose

    from flashtrain.train import Trainer

    seen, real = [], fsdp.fully_shard

    def recording(module, *args, **kwargs):
        seen.append(all(p.is_meta for p in module.parameters()))
        return real(module, *args, **kwargs)

    monkeypatch.setattr(fsdp, "fully_shard", recording)
    monkeypatch.setenv("FLASHTRAIN_CPU_ATTENTION", "torch")
    overrides = ["model=gpt2-tiny", "model.n_layer=2", "seq_len=16", "micro_batch_size=1",
                 "global_batch_size=1", "trainer.max_steps=1", "trainer.strategy=fsdp",
                 "trainer.device=cpu", "logger=none", "trainer.progress=none"]  # fmt: skip
    trainer = Trainer(compose(overrides), tmp_path / "run")
    try:
        assert len(seen) == 3 and all(seen), seen  # two blocks, then the root
        assert not any(p.is_meta for p in trainer.model.parameters())
    finally:
        trainer.close()


def test_each_rank_holds_and_reads_only_its_shards(sources, tmp_path):
    run_ranks(_rank, WORLD, tmp_path, str(sources))
    for rank in range(WORLD):
        results = json.loads((sources / f"rank{rank}.json").read_text())
        for name, r in results.items():
            where = f"rank {rank}, {name}"
            assert r["meta"], where
            hashing = READ_CHUNK if name in ("torch", "dcp") else 0  # rank 0 checks the files
            bound = r["shard"] + r["block"] + hashing + SLACK
            assert bound < r["whole"], "the model is too small for the memory check to fail"
            assert r["grew"] <= bound, (where, r["grew"] / 2**20, bound / 2**20)
            if name != "fresh":
                assert r["read"] == r["elements"], where  # the rows of its shards, nothing more
            if name == "hf":
                assert r["at_file"] == r["elements"], where
            if name == "fresh":
                assert r["distinct"], where
                std = r["std"]
                assert std["wte.weight"] == pytest.approx(0.02, rel=0.05)
                assert std["blocks.0.mlp.c_fc.weight"] == pytest.approx(0.02, rel=0.05)
                resid = 0.02 / (2 * BIG_GPT2["n_layer"]) ** 0.5  # GPT-2's depth-scaled projection
                assert std["blocks.0.mlp.c_proj.weight"] == pytest.approx(resid, rel=0.05)
            else:
                assert r["differ"] == [], (where, r["differ"][:5])
