"""The retrieval task families: what each writes for one sample (sample.TaskParts).

passkey      a 5-digit number in repeated noise sentences (Mohtashami & Jaggi 2023)
needle       a 7-digit "special magic number" for a pseudo-word, hidden in real text (pysrc or
             the user's files): needle-in-a-haystack
RULER's synthetic families (Hsieh et al. 2024), shortened to fit small contexts:
niah_single      one needle in the noise sentences
niah_multikey    four needles with different keys in real text; one is asked for
niah_multivalue  four values under one key; all are asked for
niah_multiquery  four keys; all four values are asked for
variable_tracking  VAR X = 12345 then VAR Y = VAR X ... (4 hops) in noise: every name with the value
common_words     a numbered word list; the 5 words that occur most often (no needle: no depth)
frequent_words   coded words drawn from a Zipf law; the 3 most frequent (no depth)

A family is build(rng, depth, length, fixed) -> TaskParts: depth in [0, 1] for the needle
asked about (the others at seeded depths), length the sample's tokens, fixed(parts) the
tokens of everything but the filler (the word lists fill what the length leaves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flashtrain.data.retrieval.sample import TaskParts
from flashtrain.data.retrieval.words import distinct, number, pseudo_word, variable_name

MAGIC_HEAD = "Special magic numbers are hidden in the text below. Find them and remember them.\n"


def passkey(rng, depth, length, fixed) -> TaskParts:
    key = number(rng, 5)
    return TaskParts(
        head="There is a pass key hidden in this text. Remember it.",
        needles=(f" The pass key is {key}. Remember it. {key} is the pass key.",),
        depths=(depth,),
        question=" What is the pass key? The pass key is",
        answer=f" {key}",
        answers=(key,),
    )


def _magic(word: str, value: str) -> str:
    return f"\nThe special magic number for {word} is: {value}.\n"


def _others(rng, depth: float, count: int) -> tuple[float, ...]:
    """The asked needle at `depth`, count - 1 more at seeded depths."""
    return (depth, *(float(d) for d in rng.uniform(0.0, 1.0, size=count - 1)))


def _asked(word: str) -> str:
    return (
        f"\nWhat is the special magic number for {word} mentioned in the text above? "
        f"The special magic number for {word} is:"
    )


def needle(rng, depth, length, fixed) -> TaskParts:
    word, value = pseudo_word(rng), number(rng, 7)
    return TaskParts(
        head=MAGIC_HEAD,
        needles=(_magic(word, value),),
        depths=(depth,),
        question=_asked(word),
        answer=f" {value}",
        answers=(value,),
    )


def niah_multikey(rng, depth, length, fixed) -> TaskParts:
    words = distinct(pseudo_word, 4, rng)
    values = distinct(lambda r: number(r, 7), 4, rng)
    return TaskParts(
        head=MAGIC_HEAD,
        needles=tuple(_magic(w, v) for w, v in zip(words, values)),
        depths=_others(rng, depth, 4),
        question=_asked(words[0]),
        answer=f" {values[0]}",
        answers=(values[0],),
    )


def niah_multivalue(rng, depth, length, fixed) -> TaskParts:
    word = pseudo_word(rng)
    values = distinct(lambda r: number(r, 7), 4, rng)
    depths = _others(rng, depth, 4)
    in_text = [values[i] for i in sorted(range(4), key=lambda i: depths[i])]
    return TaskParts(
        head=MAGIC_HEAD,
        needles=tuple(_magic(word, v) for v in values),
        depths=depths,
        question=f"\nWhat are all the special magic numbers for {word} mentioned in the text "
        f"above? The special magic numbers for {word} are:",
        answer=" " + ", ".join(in_text),
        answers=tuple(values),
    )


def niah_multiquery(rng, depth, length, fixed) -> TaskParts:
    words = distinct(pseudo_word, 4, rng)
    values = distinct(lambda r: number(r, 7), 4, rng)
    names = f"{', '.join(words[:3])} and {words[3]}"
    return TaskParts(
        head=MAGIC_HEAD,
        needles=tuple(_magic(w, v) for w, v in zip(words, values)),
        depths=_others(rng, depth, 4),
        question=f"\nWhat are the special magic numbers for {names} mentioned in the text above? "
        f"The special magic numbers for {names} are:",
        answer=" " + ", ".join(values),
        answers=tuple(values),
    )


def variable_tracking(rng, depth, length, fixed) -> TaskParts:
    names = distinct(variable_name, 5, rng)
    value = number(rng, 5)
    chain = [
        f" VAR {names[0]} = {value}.",
        *(f" VAR {b} = VAR {a}." for a, b in zip(names, names[1:])),
    ]
    later = sorted(float(d) for d in rng.uniform(depth, 1.0, size=len(chain) - 1))
    return TaskParts(
        head="Memorize and track the chain of variable assignments hidden in the text below.",
        needles=tuple(chain),
        depths=(depth, *later),  # in chain order
        question=f" Question: find all variables that are assigned the value {value} in the text "
        f"above. Answer: the variables assigned the value {value} are:",
        answer=" " + " ".join(names),
        answers=tuple(names),
    )


def common_words(rng, depth, length, fixed) -> TaskParts:
    """A numbered list: 5 common words 3+ times each (a third of the list), the rest once."""
    head = "Below is a numbered list of words. Some of them occur more often than others."

    def parts_for(items: list[str], top: list[str]) -> TaskParts:
        listing = "".join(f" {i + 1}. {w}" for i, w in enumerate(items))
        return TaskParts(
            head=head,
            needles=(listing,),
            depths=(1.0,),  # the noise filler pads before the list
            question=" Question: what are the 5 most common words in the list above? Answer: "
            "the 5 words that occur most often in the list are:",
            answer=" " + " ".join(top),
            answers=tuple(top),
        )

    probe = parts_for(["bakodu"] * 2, ["bakodu"] * 5)
    per_item = max(1, fixed(probe) - fixed(parts_for(["bakodu"], ["bakodu"] * 5)))
    items = max(0, (length - fixed(parts_for([], ["bakodu"] * 5))) // (per_item + 1))
    repeats = items // 15  # 5 common words x repeats = a third of the list
    if repeats < 2:
        raise ValueError(
            f"task common_words needs a list of >= 30 words (>= {fixed(probe) + 30 * per_item} "
            f"tokens with this tokenizer); the length {length} fits {items}: ask for more"
        )
    words = distinct(pseudo_word, 5 + items, rng)
    top, rare = words[:5], words[5 : 5 + items - 5 * repeats]
    listed = [*(w for w in top for _ in range(repeats)), *rare]
    listed = [listed[i] for i in rng.permutation(len(listed))]
    while listed and fixed(parts_for(listed, top)) > length:  # tokens merged otherwise than counted
        listed.remove(next(w for w in reversed(listed) if w not in top))
    order = sorted(top, key=listed.index)
    return parts_for(listed, order)


def frequent_words(rng, depth, length, fixed) -> TaskParts:
    """Coded words drawn with probability ~ 1 / rank^2 (RULER's Zipf law, alpha 2)."""
    head = "Read the coded text below and count how often each coded word occurs."

    def parts_for(text: list[str], top: list[str]) -> TaskParts:
        return TaskParts(
            head=head,
            needles=(" " + " ".join(text) + " .",) if text else (" .",),
            depths=(1.0,),
            question=" Question: what are the 3 most frequent coded words in the coded text above? "
            "Answer: the 3 most frequent coded words are:",
            answer=" " + " ".join(top),
            answers=tuple(top),
        )

    vocab = distinct(lambda r: pseudo_word(r, 2), 40, rng)
    per_word = max(
        1, fixed(parts_for(vocab[:2], vocab[:3])) - fixed(parts_for(vocab[:1], vocab[:3]))
    )
    count = max(0, (length - fixed(parts_for([], vocab[:3]))) // (per_word + 1))
    if count < 40:
        raise ValueError(
            f"task frequent_words needs >= 40 coded words (>= {fixed(parts_for(vocab[:1], vocab[:3])) + 40 * per_word} "
            f"tokens with this tokenizer); the length {length} fits {count}: ask for more"
        )
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 2
    for _ in range(1000):  # until the top three counts differ (a clear answer)
        text = list(rng.choice(vocab, size=count, p=weights / weights.sum()))
        counts = sorted(((text.count(w), w) for w in set(text)), reverse=True)
        if len(counts) > 3 and counts[0][0] > counts[1][0] > counts[2][0] > counts[3][0]:
            break
    top = [w for _, w in counts[:3]]
    while fixed(parts_for(text, top)) > length:  # tokens merged otherwise than counted
        text.pop()
        top = [w for _, w in sorted(((text.count(w), w) for w in set(text)), reverse=True)[:3]]
    return parts_for(text, top)


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[..., TaskParts]
    filler: str  # noise | text
    has_depth: bool


FAMILIES = {
    f.name: f
    for f in (
        Family("passkey", passkey, "noise", True),
        Family("needle", needle, "text", True),
        Family("niah_single", needle, "noise", True),
        Family("niah_multikey", niah_multikey, "text", True),
        Family("niah_multivalue", niah_multivalue, "text", True),
        Family("niah_multiquery", niah_multiquery, "text", True),
        Family("variable_tracking", variable_tracking, "noise", True),
        Family("common_words", common_words, "noise", False),
        Family("frequent_words", frequent_words, "noise", False),
    )
}
