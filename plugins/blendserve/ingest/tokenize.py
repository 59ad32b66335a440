"""Turn prompts into the token ids the engine will see (chat template applied).

The planner's prefix tree and the engine's prefix cache must see the same
tokens, so the engines are fed these ids, never text.
"""

from __future__ import annotations

from pathlib import Path


class PromptTokenizer:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.vocab_size = len(self.tokenizer)

    def encode_chats(self, conversations: list[list[dict]]) -> list[list[int]]:
        if not conversations:
            return []
        texts = self.tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
        # The template already holds the special tokens; adding them again would double BOS.
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def encode_texts(self, prompts: list[str]) -> list[list[int]]:
        if not prompts:
            return []
        return self.tokenizer(prompts, add_special_tokens=True)["input_ids"]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
