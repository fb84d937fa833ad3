"""Long-context retrieval evaluation: does a model find and use what lies far back in its
context? The tasks themselves (passkey, needle, RULER's families) are data:
flashtrain/data/retrieval. Here: scoring them on a model (scoring.py; by generation:
flashtrain/inference/task_answers.py), the grid of lengths x depths (grid.py) and its report,
tables, heatmap and curves (report.py). scripts/evaluate.py --tasks runs them on a checkpoint
(flashtrain/inference/retrieval_cli.py); trainer.eval_tasks at every evaluation
(flashtrain/train/retrieval_eval.py)."""
