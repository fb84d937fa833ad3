"""Block-sparse attention layouts and the patterns that make them (the public module).

from flashtrain.attention import sparsity
layout = sparsity.butterfly(16384, block_size=128)     # a BlockSparseLayout
out = blocksparse_attn_func(q, k, v, layout)
"""

from flashtrain.attention.sparsity.layout import (
    SUPPORTED_BLOCK_SIZES,
    BlockSparseLayout,
    BlockTables,
    build_tables,
)
from flashtrain.attention.sparsity.patterns import (
    PATTERNS,
    bigbird,
    butterfly,
    from_dense_mask,
    global_local,
    local,
    strided,
)

__all__ = [
    "PATTERNS", "SUPPORTED_BLOCK_SIZES", "BlockSparseLayout", "BlockTables", "bigbird",
    "build_tables", "butterfly", "from_dense_mask", "global_local", "local", "strided",
]  # fmt: skip
