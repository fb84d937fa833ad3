"""Compile the attention kernels for a GPU without one and report what the compiler made of each
(wgmma vs mma.sync, spills, registers, shared memory, stages, load path, main-loop length).

    python scripts/kernel_compile.py [--arch 90] [--launches defaults|features|decode|variants] [--only TEXT]
                                     [--front-end-only] [--markdown FILE]
    python scripts/kernel_compile.py --contract all [--only TEXT]

--contract checks what a real CUDA launch enforces at every launch point (scratch allocator in
the launching thread, shared memory, registers x threads, grid limits, descriptor alignment):
flashtrain/lab/launch_contract.py.

Run it without TRITON_INTERPRET set. The tool itself: flashtrain/lab/kernel_compile.py.
"""

import sys

from flashtrain.lab import kernel_compile, launch_contract

if __name__ == "__main__":
    if "--contract" in sys.argv[1:]:
        sys.exit(launch_contract.main())
    kernel_compile.main()
