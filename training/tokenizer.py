"""A word-level tokenizer over a fixed vocabulary: no downloads, one JSON file on disk."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<image>")


class WordTokenizer:
    """Splits text on whitespace and maps each word to its index in ``SPECIAL_TOKENS + words``.

    ``<image>`` is the placeholder whose embedding the VLM replaces by one image patch.
    """

    def __init__(self, words: Iterable[str]) -> None:
        words = list(dict.fromkeys(words))
        if clash := set(words) & set(SPECIAL_TOKENS):
            raise ValueError(f"words: expected no special tokens, got {sorted(clash)}")
        self.vocab = [*SPECIAL_TOKENS, *words]
        self._ids = {word: index for index, word in enumerate(self.vocab)}
        self.pad_id, self.bos_id, self.eos_id, self.image_id = range(len(SPECIAL_TOKENS))

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of the words of ``text``; an unknown word is a ValueError."""
        try:
            return [self._ids[word] for word in text.split()]
        except KeyError as error:
            raise ValueError(f"text: expected words of the vocabulary, got {error.args[0]!r} in {text!r}") from None

    def decode(self, ids: Sequence[int]) -> str:
        """The words of ``ids`` joined by spaces."""
        return " ".join(self.vocab[i] for i in ids)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"vocab": self.vocab}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> WordTokenizer:
        vocab = json.loads(Path(path).read_text())["vocab"]
        if tuple(vocab[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"{path}: expected a vocabulary starting with {SPECIAL_TOKENS}, got {vocab[:4]}")
        return cls(vocab[len(SPECIAL_TOKENS):])
