"""Prepare a data config's caches (tokenize a corpus, generate Pathfinder images) and print the counts.

    python scripts/prepare_data.py text_files data_files='corpus/*.txt'
    python scripts/prepare_data.py openwebtext num_proc=16
    python scripts/prepare_data.py pathx num_samples=20000
    python scripts/prepare_data.py path/to/my_data.yaml key=value ...

NAME is an option of configs/data/, composed as train.py composes `data=NAME`; or a path to a
standalone data yaml that names its `loader` (synthetic | lm_corpus | mlm | pathfinder |
long_doc; see flashtrain/data/config.py). key=value pairs override the data config's keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from flashtrain.lab.checkout import CONFIGS


def load_data_config(name: str, overrides: list[str]):
    path = Path(name)
    if path.suffix:  # a standalone yaml
        if not path.is_file():
            sys.exit(f"no data config file {path}")
        cfg = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides))
        if "defaults" in cfg:
            sys.exit(
                f"{path} has a Hydra defaults list: put it under configs/data/ and pass its name, "
                "or replace the list by `loader: <name>`"
            )
        return cfg
    known = sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml"))
    if name not in known:
        sys.exit(f"no data config '{name}' in {CONFIGS / 'data'}; known: {', '.join(known)}")
    from hydra import compose, initialize_config_dir

    from flashtrain.train import register_schemas

    register_schemas()

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[f"data={name}", *(f"data.{o}" for o in overrides)]).data


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="data config name (configs/data/NAME.yaml) or yaml path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the data config")
    args = parser.parse_args()

    from flashtrain.data import prepare_data
    from flashtrain.data.registry import command_line_settings, data_config
    from flashtrain.no_space import as_no_space_error
    from flashtrain.train.entry import EXIT_NO_SPACE, config_errors_explained
    from flashtrain.train.errors import BAD_INPUT_ERRORS, USER_ERRORS, describe

    try:  # bad input (a config value, a missing or non-UTF-8 file): one line, exit 2
        with config_errors_explained():
            cfg = data_config(load_data_config(args.name, args.overrides))
        # this program guards its top level: worker processes where the config leaves them open
        cfg = dataclasses.replace(cfg, **command_line_settings(cfg))
        start = time.perf_counter()
        summary = prepare_data(cfg, progress=True)
    except (*USER_ERRORS, *BAD_INPUT_ERRORS) as e:
        print(describe(e), file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # a full disk or quota: one line, exit 4 (as train.py)
        no_space = as_no_space_error(e, "then run it again")
        if no_space is None:
            raise
        print(describe(no_space), file=sys.stderr)
        sys.exit(EXIT_NO_SPACE)
    print(f"\n{cfg.name}: prepared in {time.perf_counter() - start:.1f} s")
    for key, value in summary.items():
        print(f"  {key}: {value:,}" if isinstance(value, int) else f"  {key}: {value}")


if __name__ == "__main__":
    main()
