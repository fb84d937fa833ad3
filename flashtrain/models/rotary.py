"""Rotary position embeddings (RoPE, Su et al. 2021) and the published ways of rescaling them to
extend a model's context, as Hugging Face transformers' `rope_scaling` / `rope_parameters`
define them (the names below are theirs, `original_max_position_embeddings` shortened to
`original_max_seq_len`):

    type     parameters                                   inverse frequencies inv_freq_i (i < D/2)
    none     -                                            theta ** (-2i / D)
    linear   factor                                       theta ** (-2i / D) / factor  (position
                                                          interpolation, Chen et al. 2023)
    dynamic  factor, original_max_seq_len                 NTK-aware: for a sequence of L > original
                                                          positions, theta' = theta * (factor * L /
                                                          original - (factor - 1)) ** (D / (D - 2))
    yarn     factor, original_max_seq_len; beta_fast=32,  per-dimension blend of interpolated and
             beta_slow=1, mscale, mscale_all_dim,          original frequencies, cos/sin scaled by
             attention_factor, truncate=true               the attention factor (Peng et al. 2023)
    llama3   factor, low_freq_factor, high_freq_factor,   low frequencies / factor, high ones kept,
             original_max_seq_len                         a smooth ramp between (Llama 3.1)

GPT-2's position=rotary uses the same tables without scaling (rotary_tables).
The tables are computed in float32 the way transformers computes them (so a model here and its
transformers twin rotate q and k identically), once per forward pass and shared by every layer.
"dynamic" depends on the sequence's length L; here that is the length of the sequence the call
covers (the whole sequence under context parallelism), computed afresh each call, where
transformers keeps the largest length it has seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from flashtrain.typed_config import check_choice

ROPE_SCALING_TYPES = ("none", "linear", "dynamic", "yarn", "llama3")
# each type's parameters: (required, optional)
ROPE_SCALING_PARAMETERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "none": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_seq_len"), ()),
    "yarn": (
        ("factor", "original_max_seq_len"),
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
    ),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len"), ()),
}


YARN_BETA_DEFAULTS = {"beta_fast": 32, "beta_slow": 1}  # rotations, as in the YaRN paper


@dataclass
class RopeScalingConfig:
    """model.rope_scaling: the type and its parameters (null = not set; see the table above)."""

    type: str = "none"  # none | linear | dynamic | yarn | llama3
    factor: float | None = None  # new context / original context
    original_max_seq_len: int | None = None  # the context the model was trained at
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float | None = None  # yarn (default 32)
    beta_slow: float | None = None  # yarn (default 1)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    attention_factor: float | None = None  # yarn: cos/sin scale (default from factor, mscale)
    truncate: bool | None = None  # yarn (default true): round the correction range to integers

    def __post_init__(self):
        check_choice(self.type, ROPE_SCALING_TYPES, "model.rope_scaling.type")
        required, optional = ROPE_SCALING_PARAMETERS[self.type]
        params = [f.name for f in fields(self) if f.name != "type"]
        missing = [k for k in required if getattr(self, k) is None]
        if missing:
            raise ValueError(
                f"model.rope_scaling.type={self.type} needs "
                f"{', '.join('model.rope_scaling.' + k for k in missing)} "
                f"(its parameters: {', '.join(required + optional)})"
            )
        stray = [k for k in params if k not in required + optional and getattr(self, k) is not None]
        if stray:
            raise ValueError(
                f"model.rope_scaling.{stray[0]} does not apply to rope_scaling.type={self.type}; "
                f"its parameters: {', '.join(required + optional) or 'none'}"
            )
        if self.factor is not None and not self.factor >= 1.0:
            raise ValueError(f"model.rope_scaling.factor must be >= 1, got {self.factor}")
        self._check_yarn_ranges()
        if self.original_max_seq_len is not None and self.original_max_seq_len < 1:
            raise ValueError(
                f"model.rope_scaling.original_max_seq_len must be >= 1, got "
                f"{self.original_max_seq_len}"
            )
        if self.type == "llama3" and not (0 < self.low_freq_factor < self.high_freq_factor):
            raise ValueError(
                "model.rope_scaling (llama3) needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor}, {self.high_freq_factor}"
            )

    def _check_yarn_ranges(self) -> None:
        """transformers' ranges (rope_config_validation), as errors: a negative beta would
        crash in math.log at the first forward, 0 would be read silently as the default."""
        for key, default in YARN_BETA_DEFAULTS.items():
            beta = getattr(self, key)
            if beta is not None and not beta > 0:
                raise ValueError(
                    f"model.rope_scaling.{key} must be > 0 (null: {default}), got {beta}"
                )
        fast, slow = self.beta_fast, self.beta_slow
        if (fast or YARN_BETA_DEFAULTS["beta_fast"]) < (slow or YARN_BETA_DEFAULTS["beta_slow"]):
            shown = f"model.rope_scaling.beta_fast={fast}"
            if fast is None:
                shown = (
                    f"model.rope_scaling.beta_fast={YARN_BETA_DEFAULTS['beta_fast']} (the default)"
                )
            raise ValueError(
                f"{shown} must be >= model.rope_scaling.beta_slow="
                f"{slow if slow is not None else YARN_BETA_DEFAULTS['beta_slow']}: the ramp runs "
                "from the dimensions rotating beta_fast times over the original context down to "
                "those rotating beta_slow times"
            )
        if self.attention_factor is not None and not self.attention_factor > 0:
            raise ValueError(
                f"model.rope_scaling.attention_factor must be > 0, got {self.attention_factor}"
            )
        for key in ("mscale", "mscale_all_dim"):  # 0 counts as unset, as in transformers
            value = getattr(self, key)
            if value is not None and not value >= 0:
                raise ValueError(f"model.rope_scaling.{key} must be >= 0, got {value}")

    @property
    def depends_on_length(self) -> bool:
        return self.type == "dynamic"


def check_rotary_base(theta: float, key: str) -> None:
    """theta ** (-2i / D) must fall with i: a base of 1 turns every pair of dimensions at the
    same speed, one below 1 reverses their order."""
    if not theta > 1.0:
        raise ValueError(f"{key} must be > 1, got {theta}")


def check_rotary_head_dim(head_dim: int) -> None:
    if head_dim % 2:
        raise ValueError(
            f"rotary positions rotate pairs of dimensions: head_dim = d_model / n_head must be "
            f"even, got {head_dim}"
        )


def default_inverse_frequencies(theta: float | torch.Tensor, dim: int, device) -> torch.Tensor:
    """theta ** (-2i / dim), computed as transformers computes it (so tables match to the bit)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (theta**exponents)  # (D/2,) float32


def _yarn(theta: float, dim: int, s: RopeScalingConfig, device) -> tuple[torch.Tensor, float]:
    factor = s.factor

    def mscale_of(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.attention_factor
    if attention_factor is None:
        if s.mscale and s.mscale_all_dim:
            attention_factor = float(
                mscale_of(factor, s.mscale) / mscale_of(factor, s.mscale_all_dim)
            )
        else:
            attention_factor = mscale_of(factor)
    beta_fast = s.beta_fast or YARN_BETA_DEFAULTS["beta_fast"]
    beta_slow = s.beta_slow or YARN_BETA_DEFAULTS["beta_slow"]

    def correction_dim(rotations):  # the dimension whose wavelength fits `rotations` times
        return (dim * math.log(s.original_max_seq_len / (rotations * 2 * math.pi))) / (
            2 * math.log(theta)
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.truncate is None or s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp.to(device)  # 1: keep the original frequency, 0: interpolate
    pos_freqs = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    inv_extrapolated, inv_interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    inv_freq = inv_interpolated * (1 - extrapolation) + inv_extrapolated * extrapolation
    return inv_freq, attention_factor


def _llama3(theta: float, dim: int, s: RopeScalingConfig, device) -> torch.Tensor:
    inv_freq = default_inverse_frequencies(theta, dim, device)
    factor, low, high, old = s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_seq_len
    low_freq_wavelen, high_freq_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling: RopeScalingConfig,
    seq_len: int | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, float]:
    """(inv_freq (D/2,) float32, attention_factor): the rotation speeds of the head dimension's
    pairs and the factor cos and sin are scaled by (1 except yarn). seq_len: the sequence's
    length, which only "dynamic" uses."""
    kind = scaling.type
    if kind == "none":
        return default_inverse_frequencies(theta, head_dim, device), 1.0
    if kind == "linear":
        return default_inverse_frequencies(theta, head_dim, device) / scaling.factor, 1.0
    if kind == "dynamic":
        if seq_len is None:
            raise ValueError("rope_scaling.type=dynamic needs the sequence length")
        original = scaling.original_max_seq_len
        if seq_len <= original:
            return default_inverse_frequencies(theta, head_dim, device), 1.0
        length = torch.tensor(seq_len, dtype=torch.int64, device=device)
        base = theta * ((scaling.factor * length / original) - (scaling.factor - 1)) ** (
            head_dim / (head_dim - 2)
        )  # a float32 0-dim tensor, as transformers computes it
        return default_inverse_frequencies(base, head_dim, device), 1.0
    if kind == "yarn":
        return _yarn(theta, head_dim, scaling, device)
    return _llama3(theta, head_dim, scaling, device), 1.0


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (*positions.shape, head_dim / 2) float32 of unscaled RoPE (GPT-2's
    position=rotary; a Llama goes through inverse_frequencies for its scaling)."""
    inv_freq = default_inverse_frequencies(theta, head_dim, positions.device)
    return rotary_cos_sin(positions, inv_freq)


def rotary_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (*positions.shape, D/2) float32 of integer positions of any shape."""
    angles = positions[..., None].float() * inv_freq.to(positions.device)  # (..., D/2)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin
