"""The lab: tooling that runs the library and knows the checkout (flashtrain.lab.checkout), kept
apart from it and above flashtrain.train in the import layers. Bottom to top:

    checkout      paths of the checkout (configs/, train.py, benchmarks/results/)
    experiments   the paper's experiments as data (specs and tables)
    bench         measurement: timing, baselines, correctness at real sizes, the benchmarks
    reports       markdown reports and plots from experiment run folders
    reproduce, gpu_suite, prepare_data, make_pathfinder
                  the command-line programs (scripts/ holds thin shims calling their main())
"""
