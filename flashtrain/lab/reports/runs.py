"""Reading a run folder: its metrics, its config, where and from which commit it ran.

A train run folder (train.py's run directory) holds metrics.jsonl, .hydra/config.yaml and
run.json (the device, commit(s) and versions: flashtrain/checkpoint/run_info.py); a benchmark run
folder holds scripts/bench_attention.py's JSON (or, without CUDA, its tile-count markdown).
scripts/reproduce.py adds reproduce.json: the experiment, scale, data choice and every launch
(command, exit code). Only metrics.jsonl or a benchmark result is required; whatever else is
missing shows as unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from flashtrain.checkpoint.run_info import read_run_info
from flashtrain.lab.experiments.spec import EXPERIMENT_NAMES
from flashtrain.train.metric_names import TRAIN_TOKENS_SEEN, canonical_row

METRICS_FILE = "metrics.jsonl"
LAUNCH_FILE = "reproduce.json"
BENCH_GLOB = "attention-*.json"
TILE_COUNTS = "tile-counts-cpu.md"


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of a metrics.jsonl, in step order, with today's metric names (an old
    run's `loss` reads as `train/loss`: flashtrain/train/metric_names.py). A resumed run logs again from
    its checkpoint: a row whose step is not past the previous one drops what a crash left beyond
    that step. An unreadable line (a crash mid-write) is skipped."""
    train: list[dict] = []
    evals: list[dict] = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            continue
        row = canonical_row(row)
        step = row["step"]
        if any(key.startswith("eval/") for key in row):
            evals = [r for r in evals if r["step"] < step]
            evals.append(row)
        else:
            if train and train[-1]["step"] >= step:
                train = [r for r in train if r["step"] < step]
                evals = [r for r in evals if r["step"] < step]
            train.append(row)
    return train, evals


def _read_config(run_dir: Path) -> dict:
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:  # an interpolation this process cannot resolve
        return OmegaConf.to_container(cfg, resolve=False)


def _read_model_choice(run_dir: Path) -> str | None:
    """The model config the run was launched with ("llama-tiny"), from Hydra's record of the
    defaults it chose; None when the folder has no .hydra/hydra.yaml."""
    path = run_dir / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    # Not resolved: the rest of hydra.yaml interpolates Hydra's runtime, absent here.
    choice = OmegaConf.select(OmegaConf.load(path), "hydra.runtime.choices.model", default=None)
    return None if choice is None else str(choice)


@dataclass
class RunRecord:
    path: Path
    name: str
    kind: str  # train | bench
    experiment: str
    scale: str | None = None
    data_choice: str | None = None
    model_choice: str | None = None  # the model config chosen: "gpt2-tiny" (.hydra/hydra.yaml)
    config: dict = field(default_factory=dict)
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    device: str = "unknown"
    commits: list[str] = field(default_factory=list)
    bench: list[dict] = field(default_factory=list)  # benchmark JSON payloads
    tile_counts: str | None = None  # the CPU benchmark's markdown
    exit_code: int | None = None  # of reproduce.py's last launch (None: unknown or running)

    @property
    def planned_steps(self) -> int | None:
        return self.config.get("trainer", {}).get("max_steps")

    @property
    def steps(self) -> int:
        return self.train[-1]["step"] if self.train else 0

    @property
    def tokens_seen(self) -> float | None:
        return self.train[-1].get(TRAIN_TOKENS_SEEN) if self.train else None

    @property
    def model(self) -> str:
        """ "llama (llama-tiny)": the architecture and the model config chosen, either alone when
        only one is known or they are the same word; "unknown" when neither was recorded."""
        arch = self.cfg("model.arch")
        choice = self.model_choice
        if arch and choice and choice != arch:
            return f"{arch} ({choice})"
        return arch or choice or "unknown"

    @property
    def status(self) -> str:
        """done | partial | not started, with the exit code of a last launch that failed."""
        if self.kind == "bench":
            state = "done" if self.bench or self.tile_counts else "no result"
        elif not self.train:
            state = "not started"
        else:
            planned = self.planned_steps
            state = "done" if planned is not None and self.steps >= planned else "partial"
        failed = self.exit_code not in (None, 0) and state != "done"
        return f"{state}, exit {self.exit_code}" if failed else state

    @property
    def commit(self) -> str:
        short = [c[:10] + ("-dirty" if c.endswith("-dirty") else "") for c in self.commits]
        return " + ".join(short) if short else "unknown"

    def last_eval(self, key: str) -> float | None:
        values = [r[key] for r in self.evals if r.get(key) is not None]
        return values[-1] if values else None

    def cfg(self, dotted: str, default=None):
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def infer_experiment(kind: str, config: dict) -> str:
    """The experiment a run folder without reproduce.json belongs to, from what it ran."""
    if kind == "bench":
        return "speed-memory"
    arch = config.get("model", {}).get("arch")
    return {"classifier": "pathfinder", "bert": "bert"}.get(arch, "context-length")


def _launch_info(run_dir: Path) -> dict:
    path = run_dir / LAUNCH_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def load_run(run_dir: str | Path) -> RunRecord:
    """The record of one run folder; ValueError when it holds neither metrics nor a result."""
    run_dir = Path(run_dir)
    benches = sorted(run_dir.glob(BENCH_GLOB))
    tile_counts = run_dir / TILE_COUNTS
    metrics = run_dir / METRICS_FILE
    launch = _launch_info(run_dir)
    kind = "bench" if benches or tile_counts.is_file() else launch.get("kind", "train")
    if kind == "train" and not metrics.is_file() and not launch:
        raise ValueError(
            f"{run_dir} is not a run folder: it has no {METRICS_FILE}, no {LAUNCH_FILE} and no "
            f"benchmark result ({BENCH_GLOB} or {TILE_COUNTS})"
        )
    record = RunRecord(
        path=run_dir,
        name=launch.get("run") or run_dir.name,
        kind=kind,
        experiment="",
        scale=launch.get("scale"),
        data_choice=launch.get("data"),
        model_choice=_read_model_choice(run_dir),
        config=_read_config(run_dir),
    )
    record.experiment = launch.get("experiment") or infer_experiment(kind, record.config)
    if record.experiment not in EXPERIMENT_NAMES:
        raise ValueError(f"{run_dir}: unknown experiment '{record.experiment}'")
    launches = launch.get("launches", [])
    record.exit_code = launches[-1].get("exit_code") if launches else None
    info = read_run_info(run_dir)  # where and from which commit(s) the trainer ran
    record.commits = list(dict.fromkeys(info.get("commits", [])))
    record.device = info.get("device", record.device)
    if metrics.is_file():
        record.train, record.evals = read_metrics(metrics)
    record.bench = [json.loads(p.read_text()) for p in benches]
    if tile_counts.is_file():
        record.tile_counts = tile_counts.read_text()
    if record.bench:
        env = record.bench[-1].get("env", {})
        record.device = env.get("device", record.device)
        if not record.commits and env.get("commit"):
            record.commits = [env["commit"]]
    elif record.tile_counts:
        record.device = "CPU (tile counts, no timings)"
    return record
