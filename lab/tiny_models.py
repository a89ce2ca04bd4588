"""Tiny random policies with a *trained* byte-level BPE, for llama.cpp tests and benches.

llama.cpp refuses a GPT-2-style tokenizer without merges ("cannot find tokenizer merges"), so the
merge-free byte tokenizer of `engine.models.policy.build_tiny_policy` cannot run there. This one
learns a few hundred merges from arithmetic-like text in milliseconds, like the seed model's own
tokenizer (byte-level BPE), so its GGUF conversion is the seed's path.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

SPECIALS = ["<pad>", "<bos>", "<eos>"]


def build_bpe_tokenizer(vocab_size: int = 320, seed: int = 0) -> Any:
    """A byte-level BPE with merges learned from generated arithmetic text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    corpus = [f"{rng.randint(0, 99)}{rng.choice('+-*')}{rng.randint(0, 99)}= answer {rng.randint(0, 999)} "
              f"the value in base {rng.randint(2, 9)} is {rng.randint(0, 4096):b}" for _ in range(2000)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def build_tiny_bpe_policy(out_dir: str | Path, *, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                          intermediate: int = 128, vocab_size: int = 320) -> Path:
    """Write a random tiny Llama + trained byte-level BPE to `out_dir` (loadable by load_policy)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_bpe_tokenizer(vocab_size, seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=intermediate,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
