"""Triton device code: @triton.jit kernels and their launch functions. No autograd, no modules.

Launchers (the op layer's entry points; contract in docs/interfaces.md):
    flash_fwd.flash_forward, flash_bwd.flash_backward, dropout_mask.dropout_keep_mask
hopper/: what a Hopper GPU runs where a tile config asks for it, in Gluon (the warp-specialized
backward, its schedule and the route that decides which calls take it); flash_bwd.flash_backward
asks the route.
Kernels: flash_fwd (forward), flash_bwd (delta preprocess and the backward launcher),
flash_bwd_dkdv, flash_bwd_dq. Shared device helpers: program (the kernels' common prologue:
where a program works, a head's score and dropout parameters, its rows), common (constants,
sequence bounds, held tiles), band (causal/window geometry), visit_plan (which tile ranges a
loop streams, dense or block-sparse), scores (soft-cap, ALiBi), dropout (seed and keep mask).
Host side: launch_args (checks and kernel arguments), tuning (tile tables, attention and LM
head), visit_counts (the forward's key-tile counts on the host, without a GPU), interpreter_compat
(the interpreter of triton < 3.7 under numpy >= 2.4).
"""
