"""After training: load a checkpoint, generate from it with a KV cache, evaluate it on a corpus.

    from flashtrain.inference import load_for_inference, generate
    loaded = load_for_inference("outputs/.../checkpoints")       # model, tokenizer, run facts
    tokens = generate(loaded.model, [loaded.tokenizer.encode("def ")], max_new_tokens=32)

scripts/generate.py and scripts/evaluate.py are the command lines (docs/inference.md).
"""

from flashtrain.inference.checkpoint import LoadedCheckpoint, load_for_inference
from flashtrain.inference.generate import Sampling, generate
from flashtrain.inference.kv_cache import KVCache

__all__ = ["KVCache", "LoadedCheckpoint", "Sampling", "generate", "load_for_inference"]
