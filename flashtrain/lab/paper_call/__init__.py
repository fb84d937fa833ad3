"""The paper's long-context results in one GPU call (scripts/paper_call.py, docs/gpu_session.md).

context-length (GPT-2 small on pysrc at 1K, 4K and 16K context, equal tokens, two seeds at 1K)
and Pathfinder (Pathfinder-32, then Path-X if it left chance) at the experiment matrices'
`gpu-call` scale, their steps set from throughput measured in the same call, so that the call
ends with its report inside its budget. settings.py: what runs; budget.py: the arithmetic;
driver.py: the phases; children.py: the processes; probe.py and evaluate_runs.py: two of them;
report.py: call.md and its plots.
"""
