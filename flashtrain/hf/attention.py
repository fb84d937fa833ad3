"""attn_implementation="flashtrain": flashtrain's attention ops inside transformers models.

    import flashtrain.hf
    flashtrain.hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flashtrain")

transformers (5.x) treats every implementation whose name contains "flash" as a FlashAttention
kernel with flash-attn's API: its own wrapper (the one hub kernels get) turns a padding mask into
packed sequences (unpad -> flash_attn_varlen_func -> pad: no compute on padding), packed
sequences (position_ids restarting, or cu_seq_lens from a flattening collator) into varlen calls,
and reads the layer's causal flag, scale, dropout (in training), sliding window and softcap from
the model. flashtrain's flash_attn_func / flash_attn_varlen_func have exactly that API (names,
order, GQA), so registering them there is the whole integration: `register()` puts them where
transformers looks them up for "flashtrain", and the "flashtrain" attention function checks what
the kernels cannot honour first:

- an arbitrary 4-D attention mask (a float bias, a custom pattern): falls back to PyTorch SDPA
  (refused when the layer also needs softcap, which SDPA lacks), with a one-time warning;
- output_attentions=True (passed to the layer, as Llama does, or recorded by transformers' output
  hooks, as for GPT-2, which pops the flag): no kernel materialises the probabilities, so the
  layer returns None for them, as transformers' "sdpa" and FlashAttention backends do, with a
  one-time warning naming "eager".

A padding mask takes transformers' unpad -> varlen -> pad in causal (or windowed) layers run
eagerly; in a compiled graph and in bidirectional layers it takes padded_varlen.py's static
layout instead (no data-dependent shapes, so the graph stays whole; padded queries of a
bidirectional layer without a window attend the real keys, as eager computes them).

It runs on transformers 5.0 and later: the paged-decoding slots that later 5.x releases added are
filled where they exist.
"""

from __future__ import annotations

import logging

import torch

from flashtrain.attention import flash_attn_func, flash_attn_varlen_func
from flashtrain.hf.padded_varlen import padded_as_varlen

NAME = "flashtrain"
# what _install_kernels reads or sets in transformers.modeling_flash_attention_utils, the same
# from transformers 5.0 on
_TRANSFORMERS_INTERNALS = (
    "_loaded_implementation",
    "_flash_fn",
    "_flash_varlen_fn",
    "_pad_fn",
    "_unpad_fn",
    "_pad_input",
    "_unpad_input",
    "_process_flash_kwargs_fn",
    "_lazy_define_process_function",
    "_flash_attention_forward",
)
# paged decoding (flash_attn_with_kvcache over a block table): 5.0 has neither slot, 5.18 the
# kernel's, 5.19 on its kwargs processor's too; flashtrain has no paged kernel to give it
_PAGED_DECODING_SLOTS = {"_flash_with_kvcache_fn": None, "_process_with_kvcache_kwargs_fn": dict}
# what transformers' wrapper takes for packed sequences: the padded layout passes its own
_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
log = logging.getLogger("flashtrain.hf")
_warned_fallback = False
_warned_attentions = False


def _install_kernels() -> None:
    """Make transformers' FlashAttention wrapper call flashtrain's ops for NAME (transformers
    keeps one loaded implementation at a time; another model's flash_attention_2 may replace
    it, so this runs before every call; it is a pointer comparison when nothing changed)."""
    import transformers.modeling_flash_attention_utils as fa

    missing = [name for name in _TRANSFORMERS_INTERNALS if not hasattr(fa, name)]
    if missing:
        import transformers

        raise ImportError(
            f'attn_implementation="flashtrain" plugs into transformers\' FlashAttention path, '
            f"whose internals differ in transformers {transformers.__version__} (no "
            f"{', '.join(missing)}); it is tested with transformers 5.x"
        )
    if fa._loaded_implementation == NAME and fa._flash_varlen_fn is flash_attn_varlen_func:
        return
    fa._flash_fn, fa._flash_varlen_fn = flash_attn_func, flash_attn_varlen_func
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(flash_attn_varlen_func)
    for slot, value in _PAGED_DECODING_SLOTS.items():
        if hasattr(fa, slot):
            setattr(fa, slot, value)
    fa._loaded_implementation = NAME


def flashtrain_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, Hq, T, D), key / value
    (B, Hkv, S, D), attention_mask None or (B, S) bool (1 = real token) -> ((B, T, Hq, D), None).
    The rest is transformers' FlashAttention wrapper (flash_attention_forward) minus its cast of
    float32 inputs to half precision: flashtrain's ops take float32 as they are."""
    from transformers.modeling_flash_attention_utils import _flash_attention_forward

    if _attentions_requested(kwargs):
        _warn_no_attentions()
    if kwargs.get("s_aux") is not None:
        raise ValueError(
            'attn_implementation="flashtrain" has no attention sinks (s_aux); use "eager" or "sdpa"'
        )
    if attention_mask is not None and attention_mask.dim() != 2:
        return _sdpa_fallback(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            softcap=softcap, is_causal=is_causal, **kwargs,
        )  # fmt: skip
    _install_kernels()
    causal = module.is_causal if is_causal is None else is_causal
    options = dict(
        is_causal=causal, dropout=dropout, softmax_scale=scaling, sliding_window=sliding_window,
        softcap=softcap,
        use_top_left_mask=False,  # causal aligned bottom-right, as flashtrain's ops do
        target_dtype=None, attn_implementation=NAME, layer_idx=getattr(module, "layer_idx", None),
    )  # fmt: skip
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, T, H, D)
    # eager gives a padded query of a bidirectional layer the real keys: so does the static layout
    padded_queries_attend = not causal and sliding_window is None
    if attention_mask is not None and (torch.compiler.is_compiling() or padded_queries_attend):
        rest = {name: kwargs[name] for name in kwargs if name not in _VARLEN_KWARGS}

        def varlen(q, k, v, cu_q, cu_k, max_q, max_k):
            return _flash_attention_forward(
                q, k, v, None, query_length=max_q, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k,
                max_length_q=max_q, max_length_k=max_k, **options, **rest,
            )  # fmt: skip

        out = padded_as_varlen(
            q, k, v, attention_mask, varlen, padded_queries_attend=padded_queries_attend
        )
        return out, None
    out = _flash_attention_forward(
        q, k, v, attention_mask, query_length=query.shape[2], **options, **kwargs
    )
    return out, None  # (B, T, Hq, D)


def _attentions_requested(kwargs: dict) -> bool:
    """Whether the caller asked for the attention probabilities (output_attentions=True, in the
    call or the config). Some layers pass the flag on (Llama); others do not (GPT-2 pops it) and
    transformers' output recorder collects what each attention layer returns, so its active
    collector is asked too."""
    if kwargs.get("output_attentions", False):
        return True
    if torch.compiler.is_compiling():  # dynamo cannot read a ContextVar: the flag alone counts
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without the recorder passes the flag on
        return False
    collecting = _active_collector.get() or {}
    return "attentions" in collecting or "cross_attentions" in collecting


def _warn_no_attentions() -> None:
    global _warned_attentions
    if not _warned_attentions:
        log.warning(
            'attn_implementation="flashtrain" does not support output_attentions=True: its '
            "kernels compute no attention probabilities, so its layers return none (as "
            '"sdpa" does); use attn_implementation="eager" for them'
        )
        _warned_attentions = True


def _sdpa_fallback(module, query, key, value, attention_mask, **kwargs):
    global _warned_fallback
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("softcap") is not None:
        raise ValueError(
            f'attn_implementation="flashtrain" got a {attention_mask.dim()}-D attention mask, '
            "which its kernels cannot take (they take causal, windows and padding), and the "
            "layer's softcap rules out the SDPA fallback; pass a 2-D padding mask or use "
            'attn_implementation="eager"'
        )
    if not _warned_fallback:
        log.warning(
            'attn_implementation="flashtrain": a %d-D attention mask (an arbitrary pattern or '
            "bias) runs on PyTorch SDPA instead of flashtrain's kernels",
            attention_mask.dim(),
        )
        _warned_fallback = True
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register "flashtrain" with transformers' attention and mask registries; returns the
    name to pass as attn_implementation. Safe to call more than once."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _install_kernels()  # model construction already looks the functions up
    AttentionInterface.register(NAME, flashtrain_attention_forward)
    AttentionMaskInterface.register(NAME, padding_mask)
    return NAME


def padding_mask(*, kv_length: int, attention_mask: torch.Tensor | None = None, **kwargs):
    """The mask function for NAME: transformers' flash_attention_mask (None when no token is
    padding, else the (B, kv_length) padding mask), except that a compiled graph keeps the mask
    whatever its values: asking whether every token is real is a data-dependent branch (a graph
    break), and the padded layout gives a mask without padding the dense result."""
    from transformers.masking_utils import flash_attention_mask

    if attention_mask is not None and torch.compiler.is_compiling():
        return attention_mask[:, -kv_length:]
    return flash_attention_mask(kv_length=kv_length, attention_mask=attention_mask, **kwargs)
