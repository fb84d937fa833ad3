"""After training: load a checkpoint, generate from it with a KV cache, evaluate it on a corpus.

    from flashtrain.checkpoint import load_model
    from flashtrain.inference import generate, run_config, run_tokenizer
    model, info = load_model("outputs/.../checkpoints")          # the one loader (and run facts)
    tokenizer = run_tokenizer(run_config(info).data, checkpoint=info)
    tokens = generate(model, [tokenizer.encode("def ")], max_new_tokens=32)

scripts/generate.py and scripts/evaluate.py are the command lines (docs/inference.md).
"""

from flashtrain.inference.generate import Sampling, generate
from flashtrain.inference.kv_cache import KVCache
from flashtrain.inference.run_tokenizer import run_config, run_tokenizer

__all__ = ["KVCache", "Sampling", "generate", "run_config", "run_tokenizer"]
