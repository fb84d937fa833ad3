"""The GPU suite: every headline figure in one call, streamed into the folder that comes back.

cli.py       the command (scripts/gpu_suite.py): sections in order, budget, exit code
sections.py  what each section measures, at real sizes on a GPU and toy ones in the dry run
record.py    suite.json + summary.md after every measurement; SIGINT/SIGTERM and budget stops
summary.py   summary.md's tables;  targets.py  the issue-12, -43 and -44 targets;  plots.py  the PNGs
hopper.py    the hopper section: the Gluon kernels' guard, checks, timing and table entries
loss_section.py  the loss section: the LM head's loss, fused vs chunked, compiled and Liger
"""
