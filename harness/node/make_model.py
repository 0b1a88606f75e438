"""Build a small model directory with seeded random weights and a locally trained tokenizer.

Shipped to a node and run by its engine interpreter (torch, transformers, tokenizers; nothing from a
model hub): ``python make_model.py --config model.json --out DIR [--seed 0] [--dtype bfloat16]``. Writes
``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` and the chat template
(``chat_template.jinja``) into DIR through a temporary sibling directory renamed when complete, so a half-built
model is never served; an existing complete DIR is left as is (prints ``exists``), except that one built before
the chat template existed gets its ``chat_template.jinja`` (written aside and renamed in). The tokenizer is a
byte-level BPE trained on seeded text, so any text encodes and the same seed gives the same vocabulary. Prints
one JSON line describing DIR.

The chat template makes ``/v1/chat/completions`` work on the random model (a server refuses chat for a
tokenizer without one): ``<s>`` then one ``role: content`` line per message, then ``assistant:`` when a
generation prompt is asked for. Plain text, so every message encodes with the same byte-level BPE.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

WORDS = ("kv", "cache", "storage", "tier", "token", "prefill", "decode", "nvme", "fabric", "latency",
         "bandwidth", "session", "prompt", "layer", "chunk", "pool", "gpu", "node", "port", "queue")
SPECIALS = ["<unk>", "<s>", "</s>"]
MARKER = ".kvgate-model-complete"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# Content is a string (vLLM detects the "string" content format from this template's use of message['content']).
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def train_tokenizer(vocab_size: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(50)) for _ in range(2000)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def build(config: dict, out: Path, seed: int, dtype: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    cfg = dict(config)
    model_type = cfg.pop("model_type", "llama")
    cfg.pop("architectures", None)
    cfg.setdefault("bos_token_id", SPECIALS.index("<s>"))
    cfg.setdefault("eos_token_id", SPECIALS.index("</s>"))
    cfg["torch_dtype"] = dtype
    hf_cfg = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_cfg).to(getattr(torch, dtype))
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok = train_tokenizer(int(hf_cfg.vocab_size), seed)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(tmp)
    # Written as its own file, the form transformers (>= 4.47) and vLLM read whatever version saved the rest.
    (tmp / CHAT_TEMPLATE_FILE).write_text(CHAT_TEMPLATE)
    info = {"dir": str(out), "model_type": model_type, "dtype": dtype, "seed": seed,
            "parameters": sum(p.numel() for p in model.parameters()), "vocab_size": tok.get_vocab_size(),
            "chat_template": True}
    (tmp / MARKER).write_text(json.dumps(info) + "\n")
    os.rename(tmp, out)
    return info


def ensure_chat_template(out: Path) -> bool:
    """Give a complete model directory built before the chat template existed its template (written aside and
    renamed in, so a reader sees the file whole or not at all). True when it was added."""
    target = out / CHAT_TEMPLATE_FILE
    if target.exists():
        return False
    tmp = out / f".{CHAT_TEMPLATE_FILE}.tmp-{os.getpid()}"
    tmp.write_text(CHAT_TEMPLATE)
    os.rename(tmp, target)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a transformers config.json (model_type, sizes)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = ap.parse_args(argv)
    out = Path(a.out)
    if (out / MARKER).exists():
        added = ensure_chat_template(out)
        print(json.dumps(dict(json.loads((out / MARKER).read_text()), exists=True, chat_template=True,
                              chat_template_added=added)))
        return 0
    if out.exists():
        print(f"make_model: {out} exists but is not a complete model built by kvgate; refusing to touch it",
              file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    info = build(json.loads(Path(a.config).read_text()), out, a.seed, a.dtype)
    print(json.dumps(dict(info, exists=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
