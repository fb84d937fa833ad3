"""Gluon kernels for Hopper (sm_90): the code a Hopper GPU runs where a config asks for it.

    flash_fwd_ws   the warp-specialized, persistent attention forward (FlashAttention-3's
                   structure: a loader, two consumer warpgroups in ping-pong)
    fwd_schedule   its schedule (work items, key tiles, ring slots, turns) as Triton functions of
                   scalars, shared with a probe kernel that the CPU tests run under the
                   interpreter (the Gluon kernels cannot run there)
    flash_bwd_ws   the warp-specialized attention backward (FlashAttention-3's structure)
    schedule       its schedule, likewise shared with a probe kernel
    route          which calls each covers (the rest keep the Triton kernels)
    gluon_api      the Gluon names across the Triton versions they compile under
"""
