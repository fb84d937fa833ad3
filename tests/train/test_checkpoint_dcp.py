"""Sharded (DCP, FSDP2) checkpoints under a 2-process gloo group: each rank hashes its own shards
while writing them (nothing is read back), meta.json lists every file, and a flipped bit in one
rank's shard is refused on every rank, naming the file."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

from train_testing import HANG_GUARD_S, free_port, subprocess_env

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Embedding(16, 8), nn.Linear(8, 8), nn.Linear(8, 16)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    def main(rank, root, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from flashtrain.checkpoint import read as ckpt
        from flashtrain.checkpoint import manifest as checkpoint_manifest
        from flashtrain.checkpoint.write import save_checkpoint

        torch.manual_seed(0)
        model = Net()
        mesh = init_device_mesh("cpu", (2,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(torch.randint(0, 16, (4, 5))).logsumexp(-1).mean().backward()
        opt.step()

        real_hash = checkpoint_manifest.hash_file
        read_back = []
        checkpoint_manifest.hash_file = lambda p, *a: read_back.append(p.name) or real_hash(p, *a)
        path = save_checkpoint(
            root, 1, model=model, optimizer=opt, trainer_state={"step": 1},
            meta={}, sharded=True,
        )
        result = {"read_while_saving": list(read_back)}
        read_back.clear()
        state, _ = ckpt.load_checkpoint(path, model=model, optimizer=opt, sharded=True)
        result.update(read_while_loading=list(read_back), loaded_step=state["step"])

        dist.barrier()
        if rank == 0:  # damage rank 1's shard
            shard = path / "__1_0.distcp"
            data = bytearray(shard.read_bytes())
            data[len(data) // 2] ^= 0x04
            shard.write_bytes(bytes(data))
        dist.barrier()
        try:
            ckpt.load_checkpoint(path, model=model, optimizer=opt, sharded=True)
            result["error"] = None
        except ckpt.CheckpointError as e:
            result["error"] = str(e)
        with open(os.path.join(root, f"result{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.start_processes(main, args=(sys.argv[1], int(sys.argv[2])), nprocs=2,
                           start_method="fork")
    """
)


def test_sharded_checkpoint_hashes_while_writing_and_refuses_a_damaged_shard(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path), str(free_port())],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    path = tmp_path / "step_000001"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["format"] == "dcp" and meta["version"] == 2
    files = sorted(p.name for p in path.iterdir() if p.name != "meta.json")
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt"]
    assert sorted(meta["files"]) == files
    for rank in (0, 1):
        result = json.loads((tmp_path / f"result{rank}.json").read_text())
        assert result["loaded_step"] == 1
        # no file was read back while saving; loading hashed its share of the files once
        assert result["read_while_saving"] == []
        assert result["read_while_loading"] == files[rank::2]
        assert "corrupt" in result["error"] and "__1_0.distcp" in result["error"]
    # the recorded digests are those of the intact files (rank 1's shard is now damaged)
    for name in (".metadata", "__0_0.distcp", "trainer.pt"):
        assert (
            meta["files"][name]["sha256"] == hashlib.sha256((path / name).read_bytes()).hexdigest()
        )
    damaged = hashlib.sha256((path / "__1_0.distcp").read_bytes()).hexdigest()
    assert meta["files"]["__1_0.distcp"]["sha256"] != damaged
