"""Train a flashtrain model: `python train.py [overrides]` (see configs/train.yaml).

python train.py                                   # tiny GPT-2 on synthetic data, CPU or GPU
python train.py experiment=owt/gpt2s-4k           # a preset from configs/experiment/
torchrun --nproc_per_node=8 train.py experiment=owt/gpt2s-4k trainer.strategy=fsdp
"""

import hydra
from omegaconf import DictConfig

from flashtrain.lab.checkout import use_checkout_kernels
from flashtrain.train import main as flashtrain_main
from flashtrain.train import register_schemas
from flashtrain.train.entry import config_errors_explained


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    flashtrain_main(cfg)


if __name__ == "__main__":
    use_checkout_kernels()  # a checkout run without installing (a GPU machine's copy) is complete
    register_schemas()  # the typed schemas Hydra composes configs/ onto
    with config_errors_explained():
        main()
