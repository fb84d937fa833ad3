"""Experiment reports from run folders: tables (ours beside the paper's figures) and plots.

write_reports(run_dirs, out_dir) -> [<out_dir>/<experiment>.md, ...]   (scripts/report.py)
"""

from flashtrain.lab.reports.build import write_reports

__all__ = ["write_reports"]
