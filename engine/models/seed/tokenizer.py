"""A byte-level BPE tokenizer trained on the seed corpus, one digit per token (arithmetic needs it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def build_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """Train the BPE and wrap it as a transformers fast tokenizer (save/load offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits split first so no merge ever joins two digits; ByteLevel then covers every byte (no <unk>).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   model_max_length=2048, clean_up_tokenization_spaces=False)
