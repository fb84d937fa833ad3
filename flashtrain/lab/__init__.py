"""The lab: tooling that runs the library and knows the checkout (flashtrain.lab.checkout), kept
apart from it and above flashtrain.train in the import layers. Bottom to top:

    checkout      paths of the checkout (configs/, train.py, benchmarks/results/); it also maps
                  the checkout's kernels/ to flashtrain.kernels where flashtrain is not installed
    experiments   the paper's experiments: tables over the YAML presets in configs/experiment/
    bench         measurement: timing, baselines, correctness at real sizes, the benchmarks
    reports       markdown reports and plots from experiment run folders
    reproduce, gpu_suite, prepare_data, make_pathfinder
                  the command-line programs (scripts/ holds thin shims calling their main())
"""

from flashtrain.lab import checkout  # noqa: F401  (a checkout run without installing is complete)
