"""Task text to token ids with a run's own tokenizer, one piece at a time, so that a prompt's
length is exact: a piece's ids never depend on its neighbours, and the tokenizer's own
leading special tokens (Llama's <|begin_of_text|>) come once, before everything.

    encoder = SegmentEncoder(run_tokenizer(cfg.data))
    ids = encoder.prefix + encoder.encode(" The pass key is 71432.")
"""

from __future__ import annotations

from functools import lru_cache


class TaskTextError(ValueError):
    """The run's tokenizer cannot write the task's text (integer ids, an unknown character)."""


class SegmentEncoder:
    """encode(text) -> ids of that text alone (no special tokens); prefix: the ids the
    tokenizer puts before a whole text (<bos>; none for bytes and GPT-2); decode(ids) -> text;
    normalized(text): the text as the tokenizer gives it back (lowercased by an uncased
    WordPiece), which is what generated text is compared with."""

    def __init__(self, tokenizer):
        # run_tokenizer's TextTokenizer wraps the data tokenizer; IntegerTokenizer wraps none
        self.tokenizer = getattr(tokenizer, "inner", tokenizer)
        self.name = getattr(tokenizer, "name", type(tokenizer).__name__)
        if not hasattr(self.tokenizer, "encode_batch"):
            raise TaskTextError(
                f"the retrieval tasks are text, and this run's tokenizer ({self.name}) writes "
                "none: its data is synthetic (integer token ids); evaluate them on a run trained "
                "on text (data=pysrc, text_files, data=retrieval, ...)"
            )
        self.eos_id = self.tokenizer.eos_id
        self._unk = self.tokenizer.unk_id
        backend = getattr(self.tokenizer, "backend", None)
        if self._unk is None and backend is not None:  # the model's own, unnamed in its config
            unk_token = getattr(backend.model, "unk_token", None)
            self._unk = backend.token_to_id(unk_token) if unk_token else None
        self._encode = lru_cache(maxsize=4096)(self._encode_uncached)
        self.prefix: list[int] = self._with_specials("")

    def _with_specials(self, text: str) -> list[int]:
        backend = getattr(self.tokenizer, "backend", None)
        if backend is None:
            return []
        whole = self.tokenizer.encode_batch([text])[0]
        plain = backend.encode(text, add_special_tokens=False).ids
        return whole[: len(whole) - len(plain)] if whole[len(whole) - len(plain) :] == plain else []

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        ids = self._plain(text)
        if self._unk is not None and self._unk in ids:
            bad = next((c for c in dict.fromkeys(text) if self._unk in self._plain(c)), "?")
            raise TaskTextError(
                f"the run's tokenizer ({self.name}) cannot encode the task text {text[:60]!r}: "
                f"it has no token for {bad!r} (it becomes its unknown token)"
            )
        return tuple(ids)

    def _plain(self, text: str) -> list[int]:
        """The text's ids without special tokens (a tokenizers backend's post-processor off)."""
        backend = getattr(self.tokenizer, "backend", None)
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode_batch([text])[0]

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def normalized(self, text: str) -> str:
        return self.decode(self.encode(text)).strip()
