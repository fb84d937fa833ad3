"""Experiment reports from run folders: tables and plots of our runs (one row and one curve per
run, with its model), the paper's figures in tables and panels of their own.

write_reports(run_dirs, out_dir) -> [<out_dir>/<experiment>.md, ...]   (scripts/report.py)
"""

from flashtrain.lab.reports.build import write_reports

__all__ = ["write_reports"]
