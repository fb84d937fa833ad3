# ruff: noqa: E402, B023  (a one-off script kept as run: path set-up before the imports)
"""The one-off GPU diagnosis behind call-3 (and, with variants ("default",), D (256, 192) and no
block-sparse cases, call-4). Run from the repo root on the GPU machine:
    PYTHONPATH=$PWD python3 benchmarks/results/gpu-suite-2026-11-27-nvidia-h200/call-3/diag_atomic_dq.py
"""

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, os.getcwd())
import torch

import flashtrain.lab.checkout  # noqa: F401
from flashtrain.attention import flash_attn_func
from flashtrain.kernels import flash_bwd, tuning

sys.path.insert(0, "tests/attention")
from attention_testing import forward_backward, random_qkv, reference_results

out = Path(os.environ["OUT"])
res = []


def save():
    (out / "diag.json").write_text(json.dumps(res, indent=1, default=str))


orig = flash_bwd.reduces_through_descriptors
for D in (256, 192):
    for variant in ("default", "no_bulk_reduce", "deterministic", "no_tma_loads"):
        row = {"D": D, "variant": variant}
        try:
            flash_bwd.reduces_through_descriptors = (
                (lambda *a: False) if variant == "no_bulk_reduce" else orig
            )
            tuning._OVERRIDES.clear()
            if variant == "no_tma_loads":
                for kind in ("fwd", "dkdv", "dq"):
                    c = tuning.config(kind, D, torch.bfloat16, torch.device("cuda"))
                    tuning._OVERRIDES[kind] = tuning.replace(c, tma=False)
            row["dkdv_cfg"] = str(tuning.config("dkdv", D, torch.bfloat16, torch.device("cuda")))
            torch.manual_seed(0)
            q, k, v = random_qkv(1, 300, 300, 4, 4, D, torch.bfloat16, device="cuda")
            dout = torch.randn_like(q)
            got = forward_backward(
                lambda a, b, c: flash_attn_func(
                    a, b, c, return_lse=True, deterministic=variant == "deterministic"
                ),
                q,
                k,
                v,
                dout,
            )
            truth, _ = reference_results(q, k, v, dout)
            for name, g, t in zip(("out", "lse", "dq", "dk", "dv"), got, truth):
                g = g.double()
                row[name + "_finite"] = bool(torch.isfinite(g).all())
                bad = ~torch.isfinite(g)
                if bad.any():
                    idx = bad.nonzero()
                    row[name + "_bad_rows"] = sorted(set(idx[:, 1].tolist()))[:20]
                    row[name + "_bad_cols"] = sorted(set(idx[:, -1].tolist()))[:40]
                    row[name + "_bad_count"] = int(bad.sum())
                row[name + "_err"] = float((g - t).abs().nan_to_num(1e9).max())
        except Exception:
            row["error"] = traceback.format_exc()[-1500:]
        print(row, flush=True)
        res.append(row)
        save()
flash_bwd.reduces_through_descriptors = orig
tuning._OVERRIDES.clear()
from flashtrain.lab.bench import correctness

for case in correctness.default_cases(False):
    if case.kind != "blocksparse":
        continue
    try:
        r = correctness.check_case(case, "cuda")
    except Exception:
        r = {"case": case.name, "error": traceback.format_exc()[-1500:]}
    print(r, flush=True)
    res.append(r)
    save()
