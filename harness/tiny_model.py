"""A tiny random-weight Llama the tests build in seconds.

It borrows the default model's tokenizer (chat template and <|im_end|> eos
included), so prompts, templating and stop handling are the real ones; only
the weights are random, so its answers are gibberish of the requested length.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def build_tiny_model(
    tokenizer_dir: Path, out_dir: Path, max_position_embeddings: int = 4096, seed: int = 0, tied: bool = True
) -> Path:
    """Write a 2-layer Llama with `tokenizer_dir`'s tokenizer into `out_dir` (`seed`: its random weights).

    Tied embeddings (the default) make a greedy answer repeat the prompt's last token whatever the seed;
    `tied=False` gives a model whose answers differ from the default one's."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # the CPU attention kernels support 32, 64, 80, 96, 112, 128, ...
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, partial / name)
    partial.rename(out_dir)
    return out_dir
