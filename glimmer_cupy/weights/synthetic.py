"""Write a GGUF file with random weights and the exact tensor shapes of a Qwen3 model.

For timing only: the weights are random bytes, so the model's output is noise. The file has
llama.cpp's Q4_K_M type mix, its tensor names, order and metadata keys for arch `qwen3`, and a
small but valid byte-level BPE tokenizer, so that both glimmer_cupy and llama.cpp load it.

From the command line: tools/make_synthetic_gguf.py, or `glimmer bench decode --synthetic MODEL`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFWriter,
    LlamaFileType,
    TokenType,
)

from ..model.tokenizer import bytes_to_unicode
from .random_blocks import random_blocks

QT = GGMLQuantizationType


@dataclass(frozen=True)
class Config:
    size_label: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool  # output projection shares token_embd.weight (no output.weight in the file)
    context: int = 40960
    rope_theta: float = 1e6
    rms_eps: float = 1e-6


# From the Hugging Face config.json of each model.
CONFIGS = {
    "qwen3-0.6b": Config("0.6B", 1024, 28, 16, 8, 128, 3072, 151936, tied=True),
    "qwen3-1.7b": Config("1.7B", 2048, 28, 16, 8, 128, 6144, 151936, tied=True),
    "qwen3-4b": Config("4B", 2560, 36, 32, 8, 128, 9728, 151936, tied=True),
    "qwen3-8b": Config("8B", 4096, 36, 32, 8, 128, 12288, 151936, tied=False),
    # For tests. Every K-quant row length (hidden, heads*head_dim, ffn) is a multiple of 256.
    # Untied, so that both output.weight and a Q4_K token_embd appear.
    "tiny": Config("tiny", 256, 2, 4, 2, 64, 512, 512, tied=False, context=2048),
}

# Target standard deviation of the dequantized matrices, about that of real Qwen3 weights.
WEIGHT_STD = 0.02


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    # llama.cpp src/llama-quant.cpp, llama_tensor_get_type: the first 1/8 and the last 1/8 of the
    # layers, and every third layer in between (integer division as in C++).
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_plan(model: str, layers: int | None = None) -> list[tuple[str, tuple[int, ...], QT]]:
    """(name, shape in NumPy order (rows, cols), GGUF type) of every tensor, in file order.

    Types follow llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M rule (llama_tensor_get_type):
    - output.weight is Q6_K; with tied embeddings token_embd.weight takes the output's type
      (Q6_K), otherwise token_embd.weight keeps the default Q4_K;
    - attn_v.weight and ffn_down.weight are Q6_K on the layers where use_more_bits() holds
      (18 of 36, 14 of 28), Q4_K elsewhere;
    - every other matrix is Q4_K; 1-D norm weights stay F32.
    Order is llama-quantize's output order (its weight_name_comparer): non-layer tensors first,
    then layer by layer, names sorted within each group.
    """
    c = CONFIGS[model]
    n_layers = c.layers if layers is None else layers
    q_dim, kv_dim = c.heads * c.head_dim, c.kv_heads * c.head_dim
    top = {
        "token_embd.weight": ((c.vocab, c.hidden), QT.Q6_K if c.tied else QT.Q4_K),
        "output_norm.weight": ((c.hidden,), QT.F32),
    }
    if not c.tied:
        top["output.weight"] = ((c.vocab, c.hidden), QT.Q6_K)
    plan = [(name, *top[name]) for name in sorted(top)]
    for i in range(n_layers):
        more = QT.Q6_K if use_more_bits(i, n_layers) else QT.Q4_K
        blk = {
            "attn_norm.weight": ((c.hidden,), QT.F32),
            "attn_q.weight": ((q_dim, c.hidden), QT.Q4_K),
            "attn_k.weight": ((kv_dim, c.hidden), QT.Q4_K),
            "attn_v.weight": ((kv_dim, c.hidden), more),
            "attn_output.weight": ((c.hidden, q_dim), QT.Q4_K),
            "attn_q_norm.weight": ((c.head_dim,), QT.F32),
            "attn_k_norm.weight": ((c.head_dim,), QT.F32),
            "ffn_norm.weight": ((c.hidden,), QT.F32),
            "ffn_gate.weight": ((c.ffn, c.hidden), QT.Q4_K),
            "ffn_up.weight": ((c.ffn, c.hidden), QT.Q4_K),
            "ffn_down.weight": ((c.hidden, c.ffn), more),
        }
        plan += [(f"blk.{i}.{name}", *blk[name]) for name in sorted(blk)]
    return plan


def tensor_nbytes(shape: tuple[int, ...], qtype: QT) -> int:
    block, nbytes = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * nbytes


def _make_tensor(shape: tuple[int, ...], qtype: QT, rng: np.random.Generator) -> np.ndarray:
    if qtype == QT.F32:
        return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    rows = int(np.prod(shape[:-1]))
    return random_blocks(qtype, rows, shape[-1], rng, WEIGHT_STD).reshape(*shape[:-1], -1)


CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def make_vocab(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 byte-level characters, then two-letter tokens that the
    merges build, then unique filler tokens, then the control tokens."""
    tokens = list(bytes_to_unicode().values())   # GPT-2's order: ids 0..255 of Qwen's vocabulary
    n_filler = vocab_size - len(tokens) - len(CONTROL_TOKENS)
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [(a, b) for a in letters for b in letters][:n_filler]
    merges = [f"{a} {b}" for a, b in pairs]
    tokens += [a + b for a, b in pairs]
    # Filler of printable ASCII only, so that llama.cpp's byte-level decoder accepts every token.
    tokens += [f"<tok{i}>" for i in range(n_filler - len(pairs))]
    tokens += CONTROL_TOKENS
    n_control = len(CONTROL_TOKENS)
    types = [int(TokenType.NORMAL)] * (vocab_size - n_control) + [int(TokenType.CONTROL)] * n_control
    assert len(tokens) == vocab_size == len(set(tokens))
    return tokens, types, merges


def _add_metadata(w: GGUFWriter, c: Config, n_layers: int) -> None:
    w.add_type("model")
    w.add_name(f"Qwen3 {c.size_label} synthetic")
    w.add_size_label(c.size_label)
    w.add_description("random weights with Qwen3 shapes, for timing only")
    w.add_block_count(n_layers)
    w.add_context_length(c.context)
    w.add_embedding_length(c.hidden)
    w.add_feed_forward_length(c.ffn)
    w.add_head_count(c.heads)
    w.add_head_count_kv(c.kv_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_eps)
    w.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(2)
    tokens, types, merges = make_vocab(c.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    # As in Qwen3's own GGUFs: bos = pad = <|endoftext|>, eos = <|im_end|>, no BOS added.
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_synthetic_gguf(model: str, path, seed: int = 0, layers: int | None = None) -> Path:
    """Write the synthetic model `model` (a key of CONFIGS) to `path`; returns the path.

    Each tensor has its own generator seeded by (seed, tensor index), so the file is the same
    for a given seed whatever the thread count. Tensors are generated by a thread pool a few
    ahead of the writer and streamed to the file one by one, so memory stays bounded.
    """
    if model not in CONFIGS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(CONFIGS)}")
    if layers is not None and layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    c = CONFIGS[model]
    n_layers = c.layers if layers is None else layers
    plan = tensor_plan(model, n_layers)
    path = Path(path)

    w = GGUFWriter(path, "qwen3")
    _add_metadata(w, c, n_layers)
    for name, shape, qtype in plan:
        nbytes = tensor_nbytes(shape, qtype)
        if qtype == QT.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
        else:
            byte_shape = (*shape[:-1], nbytes // int(np.prod(shape[:-1])))
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    try:
        w.write_header_to_file(path)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()

        def make(i: int) -> np.ndarray:
            _, shape, qtype = plan[i]
            return _make_tensor(shape, qtype, np.random.default_rng([seed, i]))

        workers = os.cpu_count() or 1
        ahead = 2 * workers  # tensors in flight at most, which bounds memory (about 2 GB for 8B on 16 cores)
        with ThreadPoolExecutor(workers) as pool:
            pending = [pool.submit(make, i) for i in range(min(ahead, len(plan)))]
            for i in range(len(plan)):
                w.write_tensor_data(pending[i].result())
                pending[i] = None  # drop the array once written
                if i + ahead < len(plan):
                    pending.append(pool.submit(make, i + ahead))
    finally:
        w.close()
    return path


def cached_synthetic_gguf(model: str, say=None) -> Path:
    """The synthetic model `model` in the model cache (fetch.cache_dir), written there first if it
    is not yet; say(message) hears about the writing."""
    from .fetch import cache_dir
    path = cache_dir() / f"synthetic-{model}.gguf"
    if not path.exists():
        if say is not None:
            say(f"writing {path} (random weights, {model} shapes)")
        write_synthetic_gguf(model, path)
    return path
