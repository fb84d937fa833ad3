"""A one-node Slurm on this machine for the tests: munged, slurmctld and slurmd of their own.

Everything lives in one temporary folder (munge key and socket, slurm.conf, spool and state
folders, daemon logs); SLURM_CONF in env() points every Slurm command at this cluster, so no
system-wide Slurm or munge setting is read or touched. stop() ends the jobs, the daemons, and
any process the cluster started that outlived them (slurmstepd and job processes, found by the
SLURM_CONF in their environment), by process id.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("sbatch", "slurmctld", "slurmd", "munged")
# How long a daemon, a submission or a job state change may take on a busy machine: hang
# guards, never waited out when things work.
START_TIMEOUT = 60


def missing_requirements() -> str | None:
    """Why a local Slurm cannot be started here (None: it can)."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install -y slurm-wlm munge)"
    if os.geteuid() != 0:
        return "needs root: slurmd starts jobs as their user only when it runs as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(condition, what: str, timeout: float = START_TIMEOUT, logs=()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}\n{_tail(p)}" for p in logs)
            raise TimeoutError(f"{what}: not within {timeout:.0f} s\n{tails}")
        time.sleep(0.2)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError as e:
        return f"({e})"


class LocalSlurm:
    """One node (this host, `hostname -s`) in one partition; root runs the daemons and jobs."""

    def __init__(
        self, root: Path, cpus: int | None = None, kill_wait: int = 60, requeue_wait: int = 10
    ):
        self.root = Path(root)
        self.host = subprocess.run(
            ["hostname", "-s"], capture_output=True, text=True, check=True
        ).stdout.strip()
        self.cpus = cpus or os.cpu_count() or 2
        self.kill_wait = kill_wait
        self.requeue_wait = requeue_wait
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "socket"
        self.daemons: dict[str, subprocess.Popen] = {}
        self._daemon_logs: list = []

    # ---- setup ----------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ with this cluster's SLURM_CONF, no variables of an enclosing job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def start(self) -> LocalSlurm:
        self._start_munge()
        self._write_conf()
        for name, argv in (
            ("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)]),
            ("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host]),
        ):
            log = (self.root / f"{name}.out").open("w")
            self._daemon_logs.append(log)
            self.daemons[name] = subprocess.Popen(
                argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )
        _wait_for(self._node_ready, "the node to be idle", logs=self._logs())
        return self

    def _start_munge(self) -> None:
        folder = self.munge_socket.parent
        folder.mkdir(mode=0o700, parents=True)
        key = folder / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        argv = [
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
        ]
        log = (folder / "munged.out").open("w")
        self._daemon_logs.append(log)
        self.daemons["munged"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        _wait_for(self.munge_socket.exists, "munged's socket", logs=[folder / "munged.out"])

    def _write_conf(self) -> None:
        state, spool = self.root / "state", self.root / "spool"
        state.mkdir()
        spool.mkdir()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=flashtrain-test",
                    f"SlurmctldHost={self.host}",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    # cred_expire: how long a requeued job waits before it starts again (120 s
                    # by default)
                    f"AuthInfo=socket={self.munge_socket},cred_expire={self.requeue_wait}",
                    f"StateSaveLocation={state}",
                    f"SlurmdSpoolDir={spool}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.root / 'slurmd.log'}",
                    "SlurmctldDebug=debug",
                    "SlurmdDebug=debug",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    # a requeued job starts once eligible, not at the next minute's pass
                    "SchedulerParameters=sched_interval=2",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    f"PlugStackConfig={self.root / 'plugstack.conf'}",
                    f"KillWait={self.kill_wait}",
                    "MinJobAge=600",
                    "InactiveLimit=0",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
                    f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        (self.root / "plugstack.conf").write_text("")

    def _logs(self) -> list[Path]:
        return [
            self.root / n for n in ("slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log")
        ]

    def _node_ready(self) -> bool:
        for name, proc in self.daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}\n"
                    + "\n".join(f"--- {p}\n{_tail(p)}" for p in self._logs())
                )
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
        return out == "idle"

    # ---- commands -------------------------------------------------------------------------

    def run(self, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """A Slurm command on this cluster; check: a failure raises, saying what it printed."""
        kw.setdefault("env", self.env())
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}\n{res.stdout}{res.stderr}")
        return res

    def sbatch(self, argv: list[str], cwd: Path, env: dict[str, str]) -> str:
        out = self.run(["sbatch", "--parsable", *argv], cwd=cwd, env=env).stdout
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as {key: value} (JobState, Restarts, ExitCode, ...)."""
        out = self.run(["scontrol", "show", "job", "--oneliner", job_id]).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def log_tail(self, chars: int = 3000) -> str:
        return _tail(self.root / "slurmctld.log", chars)

    # ---- teardown -------------------------------------------------------------------------

    def stop(self) -> None:
        """End every job (SIGKILL: a test that failed has no use for a checkpoint), then the
        daemons, then whatever of the cluster's outlived them."""
        if self._running("slurmctld") and self._running("slurmd"):
            self.run(["scancel", "--full", "--signal=KILL", "--user=root"], check=False)
            with contextlib.suppress(TimeoutError, RuntimeError):  # then the leftovers' kill
                _wait_for(self._no_job_on_the_node, "the jobs to end", timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.daemons.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pid in self._leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for log in self._daemon_logs:
            log.close()

    def _running(self, name: str) -> bool:
        return name in self.daemons and self.daemons[name].poll() is None

    def _no_job_on_the_node(self) -> bool:
        states = self.run(["squeue", "-h", "-o", "%t"], check=False).stdout.split()
        return not any(state in ("R", "CG") for state in states)

    def _leftover_pids(self) -> list[int]:
        """Processes whose environment names this cluster's slurm.conf: slurmstepd and what
        the jobs started (their environment is sbatch's)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found
