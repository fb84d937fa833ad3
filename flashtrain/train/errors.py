"""Which failures are the user's and which are bugs: the one place that decides it.

A user error is a run that cannot work as configured: a config value or key, a missing file
(tokenizer, corpus, checkpoint), a corrupt token cache or checkpoint. train.py reports it as one
line saying what is wrong and what to do, exit code 2 (the traceback only with
HYDRA_FULL_ERROR=1). Anything else is a crash: a traceback and exit code 1.

The factories below the trainer check their input with ValueError (and raise FileNotFoundError /
KeyError for files and fields they cannot find); while the trainer builds from the config,
`from_config` turns those into ConfigError, so an unexpected ValueError later in a run is still
reported as the crash it is.
"""

from __future__ import annotations

import contextlib

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from flashtrain.checkpoint.manifest import CheckpointError
from flashtrain.data.token_cache import TokenCacheError
from flashtrain.typed_config import ConfigError

# Exceptions that are the user's to fix, whatever raises them (order: most common first).
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    CheckpointError,
    TokenCacheError,
    OmegaConfBaseException,
    HydraException,
)

# What a factory raises on input it cannot use (building the model, the data, the optimizer).
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, FileNotFoundError)


def _message(error: BaseException) -> str:
    if isinstance(error, KeyError) and error.args:  # str(KeyError) quotes its message
        return str(error.args[0])
    return str(error)


@contextlib.contextmanager
def from_config(what: str):
    """Around building `what` ("model", "data", ...) from the config: bad input becomes a
    ConfigError whose message names what was being built (the original is its __cause__)."""
    try:
        yield
    except USER_ERRORS:
        raise
    except BAD_INPUT_ERRORS as e:
        raise ConfigError(f"{what}: {_message(e)}") from e


def describe(error: BaseException) -> str:
    """The one line (or short block) a user error is reported with."""
    return f"{type(error).__name__}: {_message(error)}"
