"""Pathfinder preparation called from a plain script (issue 25.9): the library generates in the
calling process unless worker processes are asked for, and a request for workers from a
script's unguarded top level is refused before anything starts (each worker would import the
script, run the call again and wait forever on the cache lock its parent holds); train.py and
scripts/prepare_data.py, whose top level is guarded, still use all cores by default."""

import os
import subprocess
import sys
import textwrap

from config_testing import REPO, compose

from flashtrain.data.pathfinder.generator import all_cores

PREPARE = """
import flashtrain.data

def prepare():
    cfg = {{"loader": "pathfinder", "name": "pathfinder32", "resolution": 32,
           "contour_length": 6, "num_samples": 130, "cache_dir": "cache", "num_workers": {workers}}}
    print(flashtrain.data.prepare_data(cfg, progress=False)["train_images"])

{call}
"""
PLAIN = "prepare()"  # line 9 of the script
GUARDED = 'if __name__ == "__main__":\n    prepare()'


def _run_script(tmp_path, source: str) -> subprocess.CompletedProcess:
    """Run `source` as tmp_path/script.py (its own folder as cwd); 130 images = 3 chunks of 64,
    enough for worker processes had any started. A hang fails the test at the timeout."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90)  # fmt: skip


def test_prepare_data_at_a_scripts_top_level_generates_in_its_process(tmp_path):
    """data.num_workers left null: before, all cores, and the script hung (exit by timeout)."""
    run = _run_script(tmp_path, PREPARE.format(workers="None", call=PLAIN))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["106"]  # 130 - 2 x 12 held out (10% each, even)
    assert "leaked semaphore" not in run.stderr


def test_workers_asked_from_an_unguarded_top_level_are_refused_naming_the_line(tmp_path):
    run = _run_script(tmp_path, PREPARE.format(workers=2, call=PLAIN))
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: num_workers=2 starts worker processes")
    assert f"{tmp_path / 'script.py'}, whose line 9" in last
    assert 'if __name__ == "__main__":' in last and "num_workers=None or 1" in last
    assert "leaked semaphore" not in run.stderr
    assert not list((tmp_path / "cache").rglob("*.partial")), "nothing is started or written"


def test_workers_under_a_main_guard_run(tmp_path):
    run = _run_script(tmp_path, PREPARE.format(workers=2, call=GUARDED))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["106"] and "leaked semaphore" not in run.stderr


def test_the_call_site_is_judged_by_the_statement_running_in_the_main_script(tmp_path):
    run = _run_script(
        tmp_path,
        """
        from flashtrain.data.main_guard import unguarded_call_site

        def where():
            return unguarded_call_site()

        print("top", where())
        if "__main__" == __name__:
            print("guarded", where())
            for found in [where()]:
                print("nested", found)
        """,
    )
    assert run.returncode == 0, run.stderr
    script = tmp_path / "script.py"
    line = script.read_text().splitlines().index('print("top", where())') + 1
    assert run.stdout.splitlines() == [f"top ('{script}', {line})", "guarded None", "nested None"]


def test_pytest_and_python_c_are_not_unguarded_scripts():
    from flashtrain.data.main_guard import unguarded_call_site

    assert unguarded_call_site() is None  # pytest's own main guards its top level
    code = (
        "from flashtrain.data.main_guard import unguarded_call_site; print(unguarded_call_site())"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "None", run.stderr  # workers do not import a -c program


def test_command_line_programs_use_all_cores_when_the_config_leaves_it_open():
    from flashtrain.data.pathfinder.dataset import PathfinderClassification
    from flashtrain.data.registry import command_line_settings, data_config
    from flashtrain.train.entry import with_command_line_settings

    cfg = data_config({"loader": "pathfinder", "resolution": 32})
    assert PathfinderClassification.workers(cfg) is None  # the library: this process
    assert command_line_settings(cfg) == {"num_workers": all_cores()}
    assert command_line_settings({"loader": "pathfinder", "num_workers": 3}) == {}
    assert command_line_settings({"loader": "synthetic"}) == {}
    train_cfg = with_command_line_settings(
        compose(["data=pathfinder32", "model=pathx-classifier", "seq_len=1024"])
    )
    assert train_cfg.data.num_workers == all_cores()  # what train.py runs
