"""Build the model the vLLM engine tests serve: a tiny random-weight Llama (2 layers, hidden 128,
458k parameters, float32) and a byte-level BPE tokenizer trained here on a few lines of text,
saved with ``transformers`` / ``safetensors``. Nothing is downloaded from a model hub.

Run by scripts/engines.sh with vLLM's own environment (it has torch, transformers and
tokenizers): ``python make_tiny_llama.py OUTDIR``. The weights are seeded, so the model is the
same at every build; its text is nonsense, which the tests never read.
"""

from __future__ import annotations

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = [
    f"the quick brown fox jumps over the lazy dog {i} times on a shared gpu" for i in range(200)
]


def main(out: str) -> None:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_tiny_llama: saved {out}: vocab {len(fast)}, {n} parameters")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_llama.py OUTDIR")
    main(sys.argv[1])
