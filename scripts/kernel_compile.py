"""Compile the attention kernels for a GPU without one and report what the compiler made of each
(wgmma vs mma.sync, spills, registers, shared memory, stages, load path, main-loop length).

    python scripts/kernel_compile.py [--arch 90] [--launches defaults|features|decode] [--only TEXT]
                                     [--front-end-only] [--markdown FILE]

Run it without TRITON_INTERPRET set. The tool itself: flashtrain/lab/kernel_compile.py.
"""

from flashtrain.lab.kernel_compile import main

if __name__ == "__main__":
    main()
