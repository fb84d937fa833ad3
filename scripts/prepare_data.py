"""Prepare a data config's caches (tokenize a corpus, generate Pathfinder images) and print the counts.

    python scripts/prepare_data.py text_files data_files='corpus/*.txt'
    python scripts/prepare_data.py openwebtext num_proc=16
    python scripts/prepare_data.py pathx num_samples=20000
    python scripts/prepare_data.py path/to/my_data.yaml key=value ...

NAME is a file under configs/data/ (or a path to a data yaml); key=value pairs override its keys.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "data"


def load_data_config(name: str, overrides: list[str]):
    path = Path(name)
    if not path.suffix:
        path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        sys.exit(f"no data config '{name}' (looked for {path}); known: {known}")
    return OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="data config name (configs/data/NAME.yaml) or yaml path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the data config")
    args = parser.parse_args()

    from flashtrain.data import prepare_data

    cfg = load_data_config(args.name, args.overrides)
    start = time.perf_counter()
    summary = prepare_data(cfg, progress=True)
    print(f"\n{cfg.name}: prepared in {time.perf_counter() - start:.1f} s")
    for key, value in summary.items():
        print(f"  {key}: {value:,}" if isinstance(value, int) else f"  {key}: {value}")


if __name__ == "__main__":
    main()
