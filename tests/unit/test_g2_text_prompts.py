"""Text prompts of an exact token length with a real tokenizer trained here (no downloads)."""

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers, decoders  # noqa: E402

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


def _sentencepiece_byte_fallback() -> Tokenizer:
    """A SentencePiece-style vocabulary with byte fall-back, laid out as Llama's tokenizer.json (and llama.cpp's
    GGUF vocabularies) have it: ``<0x00>``..``<0xFF>`` are ordinary entries, "▁" marks word starts, and
    the decoder drops the first one."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(tok.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    spec["model"]["vocab"] = vocab
    for added in spec["added_tokens"]:
        added["id"] = vocab[added["content"]]
    spec["post_processor"]["special_tokens"]["<s>"]["ids"] = [1]
    return Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("make", [lambda: _bpe(False), lambda: _bpe(True), _wordlevel, _sentencepiece_byte_fallback],
                         ids=["bpe", "bpe+bos", "wordlevel", "sentencepiece-byte-fallback"])
@pytest.mark.parametrize("length", [2, 17, 256, 2048])
def test_text_encodes_to_exactly_the_requested_length(make, length):
    tok = HFTokenizers(make())
    text = text_prompt(tok, length, "s0-i0")
    assert isinstance(text, str) and len(tok.encode(text)) == length
    assert text_prompt(tok, length, "s0-i0") == text  # deterministic
    if length > 16:
        assert text_prompt(tok, length, "s0-i1") != text  # another key, another prompt


def test_byte_fallback_vocabulary_gives_valid_text_without_byte_tokens():
    """Random byte pieces decode to invalid UTF-8 (U+FFFD, three byte tokens when re-encoded): G2 used to end
    ERROR on such vocabularies ("... 24577 tokens after 50 rounds"). Prompts are drawn from whole words."""
    raw = _sentencepiece_byte_fallback()
    tok = HFTokenizers(raw)
    byte_ids = {raw.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    assert byte_ids <= set(tok.content_ids())  # byte pieces are ordinary vocabulary entries, as in Llama's
    for length in (256, 2048, 8192):
        text = text_prompt(tok, length, "s0-i0")
        ids = raw.encode(text).ids
        assert len(ids) == length and "\ufffd" not in text
        assert not byte_ids & set(ids)
        assert ids[0] == 1 and ids.count(1) == 1


def test_a_vocabulary_of_byte_pieces_only_is_an_error():
    class _BytesOnly:
        def encode(self, text):
            return list(text.encode())

        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

        def content_ids(self):
            return list(range(128, 256))  # continuation/lead bytes: none decodes to text alone

    with pytest.raises(ValueError, match="byte pieces"):
        text_prompt(_BytesOnly(), 8, "k")


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
    from harness.workloads.kit.g2 import make_text_prompts
    tok = HFTokenizers(_bpe(True))
    reqs = make_text_prompts(3, [64, 300], 2, tok)
    assert [r.prompt_tokens for r in reqs] == [64, 64, 300, 300]
    assert [len(tok.encode(r.prompt)) for r in reqs] == [64, 64, 300, 300]
    assert len({r.prompt for r in reqs}) == 4 and len({r.request_id for r in reqs}) == 4
    assert [r.prompt for r in make_text_prompts(3, [64, 300], 2, tok)] == [r.prompt for r in reqs]
