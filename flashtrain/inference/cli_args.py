"""What scripts/generate.py and scripts/evaluate.py accept, checked while the command line is
parsed, before anything is loaded: integers with a least value, finite numbers in a range, a
device this machine has. A bad value is one line on stderr and exit 2 (argparse's usage block
would bury it under a dozen lines). Also how they tell the user something beside their output
(note: a damaged checkpoint passed over)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

import torch


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line: `error: argument --x: ... (--help lists the options)`."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (--help lists the options)\n")


def integer(least: int, meaning: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= least; `meaning` says what the number counts."""
    allowed = f"an integer >= {least}{f' ({meaning})' if meaning else ''}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {allowed}")
        return value

    return parse


def token_count(least: int, meaning: str = "") -> Callable[[str], int]:
    """An argparse type: a token count >= least, as an integer or in k (1024) / m (1024k)
    units: 4096, 4k, 1m."""
    allowed = f"an integer >= {least} ({meaning + '; ' if meaning else ''}k = 1024: 4k = 4096)"
    scales = {"k": 1024, "m": 1024**2}

    def parse(text: str) -> int:
        scale = scales.get(text[-1:].lower(), 1)
        digits = text[:-1] if scale > 1 else text
        value = int(digits) * scale if digits.isdigit() else None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {allowed}")
        return value

    return parse


def number(allowed: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a finite float for which ok(value) holds; `allowed` says which."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: a number {allowed}")
        return value

    return parse


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device(text: str) -> str:
    """An argparse type: cpu, or cuda / cuda:N where this machine has that GPU (torch would fail
    later with an AssertionError or a RuntimeError naming every device type it knows)."""
    try:
        parsed = torch.device(text)
    except RuntimeError:
        parsed = None
    if parsed is not None and parsed.type == "cpu":
        return text
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if parsed is None or parsed.type != "cuda":
        where = f"cpu or cuda:0..{count - 1}" if count else "cpu (no CUDA GPU here)"
        raise argparse.ArgumentTypeError(f"{text!r} is not a device this runs on: {where}")
    if count == 0:
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU visible"
        raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available ({why}): use cpu")
    if parsed.index is not None and parsed.index >= count:
        raise argparse.ArgumentTypeError(
            f"{text!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}, or cpu"
        )
    return text


def print_note(line: str) -> None:
    """A line for the user beside the output (load_model's on_note): on stderr, so that the
    output on stdout stays the text alone."""
    print(f"note: {line}", file=sys.stderr)
