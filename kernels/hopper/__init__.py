"""Gluon kernels for Hopper (sm_90): the code a Hopper GPU runs where a config asks for it.

    flash_bwd_ws   the warp-specialized attention backward (FlashAttention-3's structure)
    schedule       its schedule as Triton functions of scalars, shared with a probe kernel that
                   the CPU tests run under the interpreter (the Gluon kernel cannot run there)
    route          which calls it covers (the rest keep the Triton kernels)
    gluon_api      the Gluon names across the Triton versions it compiles under
"""
