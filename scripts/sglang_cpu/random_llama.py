"""A tiny Llama with random weights beside a tokenizer: ``python random_llama.py TOKENIZER OUT``.

Run with the SGLang venv's python (torch, transformers, safetensors). The tests' stand-in model
until a trained one is committed: hidden 128, 2 layers, 4 heads, 2 KV heads, bf16, its embedding
exactly the tokenizer's vocabulary (no padding rows). Deterministic: seed 0.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(tokenizer_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for item in tokenizer_dir.iterdir():
        if item.is_file():
            shutil.copy2(item, out / item.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
