"""Text prompts of an exact token length with a real tokenizer trained here (no downloads)."""

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers, decoders  # noqa: E402

from harness.engines.prompts import HFTokenizers, load_tokenizer, text_prompt  # noqa: E402

CORPUS = [" ".join(f"w{(i * 7 + j * 13) % 97}ing the{j % 5} ca{i % 11}che" for j in range(40)) for i in range(200)]


def _bpe(with_bos: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<unk>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if with_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


def _wordlevel() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["<unk>"]))
    return tok


@pytest.mark.parametrize("make", [lambda: _bpe(False), lambda: _bpe(True), _wordlevel], ids=["bpe", "bpe+bos", "wordlevel"])
@pytest.mark.parametrize("length", [2, 17, 256, 2048])
def test_text_encodes_to_exactly_the_requested_length(make, length):
    tok = HFTokenizers(make())
    text = text_prompt(tok, length, "s0-i0")
    assert isinstance(text, str) and len(tok.encode(text)) == length
    assert text_prompt(tok, length, "s0-i0") == text  # deterministic
    if length > 16:
        assert text_prompt(tok, length, "s0-i1") != text  # another key, another prompt


def test_bos_is_counted_and_special_tokens_never_drawn():
    raw = _bpe(True)
    tok = HFTokenizers(raw)
    assert 0 not in tok.content_ids()
    ids = raw.encode(text_prompt(tok, 64, "k")).ids
    assert ids[0] == 0 and ids.count(0) == 1 and len(ids) == 64


def test_load_tokenizer_from_a_local_file_or_directory(tmp_path):
    _bpe(False).save(str(tmp_path / "tokenizer.json"))
    for spec in (tmp_path, tmp_path / "tokenizer.json"):
        assert len(load_tokenizer(str(spec)).encode(text_prompt(load_tokenizer(str(spec)), 33, "x"))) == 33
    with pytest.raises(FileNotFoundError, match="local files"):
        load_tokenizer(str(tmp_path / "nope"))


class _Stubborn:
    """A tokenizer whose encoding never has the requested length (every text is 3 tokens)."""

    def encode(self, text):
        return [1, 2, 3]

    def decode(self, ids):
        return "x" * len(ids)

    def content_ids(self):
        return [1, 2, 3]


def test_unreachable_length_is_an_error_not_a_wrong_prompt():
    with pytest.raises(ValueError, match="exactly 5 tokens"):
        text_prompt(_Stubborn(), 5, "k")


def test_length_that_leaves_no_room_after_bos_is_an_error():
    with pytest.raises(ValueError, match="no room"):
        text_prompt(HFTokenizers(_bpe(True)), 1, "k")


def test_g2_builds_text_prompts_of_the_configured_lengths():
    from harness.workloads.g2_ttft import make_text_prompts
    tok = HFTokenizers(_bpe(True))
    reqs = make_text_prompts(3, [64, 300], 2, tok)
    assert [r.prompt_tokens for r in reqs] == [64, 64, 300, 300]
    assert [len(tok.encode(r.prompt)) for r in reqs] == [64, 64, 300, 300]
    assert len({r.prompt for r in reqs}) == 4 and len({r.request_id for r in reqs}) == 4
    assert [r.prompt for r in make_text_prompts(3, [64, 300], 2, tok)] == [r.prompt for r in reqs]
