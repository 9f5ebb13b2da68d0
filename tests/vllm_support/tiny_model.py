"""Write a tiny random-weight Llama checkpoint for vLLM smoke tests, without the model hub.

Executed with the vLLM environment's interpreter (it needs torch, transformers and tokenizers)::

    $INSTRUMENT_VLLM_PYTHON tests/vllm_support/tiny_model.py OUT_DIR

The tokenizer is a byte-level BPE trained here on a handful of sentences; the weights are random (seeded),
bfloat16, in safetensors. ``head_dim`` is 32 because vLLM's CPU attention refuses smaller heads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 512
MAX_LEN = 256
SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
SENTENCES = (
    "Hello world, a tiny model answers a tiny prompt.",
    "Rollout workers generate sequences while the trainer updates the actor.",
    "Each rank writes one profiler trace per profiled step.",
    "Sixty four hidden units and two layers are plenty for a smoke test.",
    "The critic estimates values; the reference model scores log probabilities.",
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIALS["unk"]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([sentence for _ in range(40) for sentence in SENTENCES], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIALS["unk"],
        bos_token=SPECIALS["bos"],
        eos_token=SPECIALS["eos"],
        pad_token=SPECIALS["pad"],
        model_max_length=MAX_LEN,
    )


def build(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out_dir)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"tiny llama: {out_dir} (vocab {len(tokenizer)}, {parameters} parameters)")
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    build(Path(sys.argv[1]))
