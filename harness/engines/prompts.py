"""Text prompts of an exact token length, built with the model's own tokenizer (pure, deterministic).

Random token ids decode to text that does not always re-encode to the same number of tokens (BPE merges
across the joins, normalisation, special tokens the engine adds). ``text_prompt`` therefore draws ids,
decodes, re-encodes as the engine will (``add_special_tokens=True``) and trims or extends until the text
encodes to exactly the requested length; a tokenizer for which that does not converge is an error, never
a prompt of another length.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Protocol

from .client import CompletionRequest


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...        # as the engine encodes a prompt (special tokens on)
    def decode(self, ids: list[int]) -> str: ...
    def content_ids(self) -> list[int]: ...               # ids prompts may be drawn from (no special tokens)


class HFTokenizers:
    """Adapter for a ``tokenizers.Tokenizer`` (a model's ``tokenizer.json``)."""

    def __init__(self, tok: Any):
        self.tok = tok

    @classmethod
    def from_file(cls, path: str | Path) -> "HFTokenizers":
        from tokenizers import Tokenizer
        return cls(Tokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def content_ids(self) -> list[int]:
        special = {t.content for t in self.tok.get_added_tokens_decoder().values() if t.special}
        return sorted(i for t, i in self.tok.get_vocab(with_added_tokens=True).items() if t not in special)


def load_tokenizer(spec: str) -> HFTokenizers:
    """A local ``tokenizer.json`` file, or a directory holding one (nothing is downloaded)."""
    p = Path(spec)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"tokenizer {spec!r}: no tokenizer.json there (kvgate loads tokenizers from local files)")
    return HFTokenizers.from_file(p)


def standalone_ids(tok: TextTokenizer, content: list[int]) -> list[int]:
    """Content ids that decode on their own to printable text: byte-fall-back pieces (SentencePiece's
    ``<0xNN>``, llama.cpp's GGUF vocabularies) decode to part of a UTF-8 sequence, U+FFFD alone, and the
    replacement character then re-encodes as three byte tokens; such ids are never drawn."""
    out = []
    for i in content:
        s = tok.decode([i])
        if s.strip() and "\ufffd" not in s and s.isprintable():
            out.append(i)
    return out


def stable_word_ids(tok: TextTokenizer, content: list[int], content_set: set[int]) -> list[int]:
    """Whole-word tokens that re-encode to themselves when joined: two copies decode to the word twice,
    split by whitespace (byte-level BPE: a leading space in the token; SentencePiece: the word-boundary
    marker, dropped at the start of a text; word-level vocabularies: the decoder's space), and that text
    encodes back to the two ids. Joined, such tokens decode to text the tokenizer splits at the same
    places, so the token count is kept."""
    out = []
    for i in standalone_ids(tok, content):
        one = tok.decode([i])
        word = one.strip()
        if one not in (word, " " + word) or any(c.isspace() for c in word):
            continue
        two = tok.decode([i, i])
        if two.split() != [word, word] or two not in (one + one, one + " " + one):
            continue
        if [j for j in tok.encode(two) if j in content_set] == [i, i]:
            out.append(i)
    return out


def prompt_pool(tok: TextTokenizer, content: list[int], content_set: set[int]) -> list[int]:
    """The ids text prompts are drawn from: whole words that re-encode to themselves, else any id that decodes to
    printable text on its own; ValueError when there is none (a vocabulary of byte pieces only)."""
    pool = stable_word_ids(tok, content, content_set) or standalone_ids(tok, content)
    if not pool:
        raise ValueError("the tokenizer has no token that decodes to text on its own (only byte pieces)")
    return pool


class IdsAsText:
    """Text standing for token-id prompts, for a server that takes text only: each id becomes one of the
    tokenizer's whole-word tokens (the same ids, the same words: prompts sharing ids share text, and so tokens, as
    far as they share ids), the words are decoded to text, and that text must encode back to exactly those words
    (plus the special tokens the engine adds, e.g. BOS); anything else is a ValueError, never a prompt of other
    tokens. Built once per tokenizer (finding the words decodes the whole vocabulary).

    A vocabulary that merges across word boundaries (BPE without a whitespace pre-tokenizer: "w3" + " ca" may
    encode as "w", "3 ca") is found on a sample of word pairs when built; then each word is chosen left to right,
    the id's own word or the next one in the pool that encodes apart from the word before it, so the choice at
    a position depends only on the ids up to it and shared ids still give shared text."""

    PAIR_SAMPLE = 512

    def __init__(self, tok: TextTokenizer):
        content = tok.content_ids()
        if not content:
            raise ValueError("the tokenizer has no non-special tokens to build prompts from")
        self.tok = tok
        self.content_set = set(content)
        self.overhead = len(tok.encode(""))  # special tokens the engine adds around any prompt
        self.pool = prompt_pool(tok, content, self.content_set)
        self._pairs: dict[tuple[int, int], bool] = {}
        rng = random.Random("kvgate-ids-as-text")
        sample = [(rng.choice(self.pool), rng.choice(self.pool)) for _ in range(self.PAIR_SAMPLE)]
        self.pairwise = not all(self._apart(a, b) for a, b in sample)

    def _apart(self, a: int, b: int) -> bool:
        """Words ``a`` then ``b`` decode to text that encodes back to the two of them."""
        key = (a, b)
        if key not in self._pairs:
            got = self.tok.encode(self.tok.decode([a, b]))
            self._pairs[key] = [j for j in got if j in self.content_set] == [a, b]
        return self._pairs[key]

    def words(self, ids: list[int]) -> list[int]:
        """The word ids standing for ``ids`` (pure: the same ids, the same words)."""
        n = len(self.pool)
        if not self.pairwise:
            return [self.pool[i % n] for i in ids]
        out: list[int] = []
        for i in ids:
            w = self.pool[i % n]
            if out:
                w = next((c for r in range(min(n, 64)) if self._apart(out[-1], c := self.pool[(i + r) % n])), w)
            out.append(w)
        return out

    def tokens(self, ids: list[int]) -> int:
        """The tokens the engine counts for the text of ``ids``: the ids and the special tokens it adds."""
        return len(ids) + self.overhead

    def text(self, ids: list[int]) -> str:
        """The text of ``ids`` (ValueError when the tokenizer would not encode it back to their words)."""
        words = self.words(ids)
        text = self.tok.decode(words)
        got = self.tok.encode(text)
        if len(got) != self.tokens(ids) or [j for j in got if j in self.content_set] != words:
            raise ValueError(f"the text of a {len(ids)}-token prompt encodes to other tokens ({len(got)}, for "
                             f"{self.tokens(ids)} with {self.overhead} special): this tokenizer's words do not "
                             "encode back to themselves when joined")
        return text


def text_prompt(tok: TextTokenizer, length: int, key: str, max_rounds: int = 50) -> str:
    """Deterministic (same tokenizer, length and key -> same text) text that ``tok.encode`` turns into exactly
    ``length`` tokens. Raises ValueError when it cannot be reached."""
    if length < 1:
        raise ValueError("prompt length must be >= 1 token")
    content = tok.content_ids()
    if not content:
        raise ValueError("the tokenizer has no non-special tokens to build prompts from")
    content_set = set(content)
    overhead = len(tok.encode(""))  # special tokens the engine adds around any prompt (e.g. BOS)
    if length <= overhead:
        raise ValueError(f"prompt length {length} leaves no room for text: the tokenizer adds {overhead} "
                         "special token(s) to every prompt")
    pool = prompt_pool(tok, content, content_set)
    rng = random.Random(f"kvgate-text:{key}:{length}")
    ids = [rng.choice(pool) for _ in range(max(length - overhead, 1))]
    for _ in range(max_rounds):
        text = tok.decode(ids)
        got = tok.encode(text)
        n = len(got)
        if n == length:
            return text
        if n > length:
            # keep the content tokens of the re-encoding, minus the excess (special tokens are re-added)
            kept = [i for i in got if i in content_set]
            ids = kept[:max(len(kept) - (n - length), 1)]
        else:
            ids = ids + [rng.choice(pool) for _ in range(length - n)]
    raise ValueError(f"could not build a text prompt of exactly {length} tokens with this tokenizer "
                     f"(last try: {n} tokens after {max_rounds} rounds)")


def make_prompts(seed: int, lengths: list[int], per_length: int, vocab_size: int) -> list[CompletionRequest]:
    """Deterministic token-id prompts: same seed, lengths and vocabulary -> same prompts, any machine.
    Ids avoid 0..9 (special tokens in most vocabularies)."""
    out = []
    for length in lengths:
        for i in range(per_length):
            rng = random.Random(f"kvgate-g2:{seed}:{length}:{i}")
            ids = [rng.randrange(10, vocab_size) for _ in range(length)]
            out.append(CompletionRequest(f"s{seed}-n{length}-i{i}", ids, prompt_tokens=length))
    return out


def make_text_prompts(seed: int, lengths: list[int], per_length: int, tokenizer: TextTokenizer) -> list[CompletionRequest]:
    """Deterministic text prompts that the model's tokenizer encodes to exactly the configured lengths."""
    return [CompletionRequest(f"s{seed}-n{length}-i{i}", text_prompt(tokenizer, length, f"kvgate-g2:{seed}:{i}"),
                              prompt_tokens=length)
            for length in lengths for i in range(per_length)]
