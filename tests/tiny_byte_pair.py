"""A tiny byte-level BPE trained here in a few lines on a few sentences (nothing
downloaded): pre-split as GPT-2 splits, as real BPE vocabularies are trained, for keras_hub's
`BytePairTokenizer` families (Llama 3, Qwen, SmolLM3)."""

from __future__ import annotations

import collections
import re

CORPUS = (
    "the cat sat on the mat. the dog sat on the log! then the cat ran, and the dog ran too. "
    "a bird sang 12 songs in 2024; the sun is hot today."
)
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def _bytes_to_unicode() -> dict:
    """GPT-2's map of the 256 bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    extra = [b for b in range(256) if b not in printable]
    return {
        **{b: chr(b) for b in printable},
        **{b: chr(256 + n) for n, b in enumerate(extra)},
    }


def train_byte_pair(
    corpus: str, merges: int = 40, ascii: bool = False, specials: list[str] = SPECIALS
) -> tuple[dict, list]:
    """`(vocabulary, merges)`: the 256 bytes (or printable ASCII and the newline), the
    most frequent pairs merged in turn, then `specials` (Llama 3's by default)."""
    chars = _bytes_to_unicode()
    if ascii:
        chars = {b: c for b, c in chars.items() if 32 <= b < 127 or b == 10}
    pieces = re.findall(r" ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", corpus)
    words = collections.Counter(tuple("".join(chars[b] for b in p.encode())) for p in pieces)
    learned = []
    for _ in range(merges):
        pairs = collections.Counter()
        for word, count in words.items():
            for pair in zip(word[:-1], word[1:], strict=True):
                pairs[pair] += count
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        learned.append(f"{a} {b}")
        merged = {}
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i : i + 2] == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = count
        words = merged
    vocabulary = {c: i for i, c in enumerate(chars.values())}
    for merge in learned:
        vocabulary.setdefault(merge.replace(" ", ""), len(vocabulary))
    for special in specials:
        vocabulary[special] = len(vocabulary)
    return vocabulary, learned
