"""Record golden greedy outputs from an independent implementation.

transformers reads each GGUF file itself, dequantizes every weight to float32 and runs the
model in float32 on the CPU; the prompt ids, the greedy continuation, raw logits of the top 5
tokens for the first steps and the top-1/top-2 margin at every step go to tests/golden/.

With --cross-check, the same token sequences also go through llama-cpp-python (CPU build), once
with the GGUF file as is and once with a float32 copy that llama.cpp dequantizes itself; the
distances are printed and stored under "cross_check".

    python tools/record_golden.py                        # both models
    python tools/record_golden.py --models gemma3-270m --cross-check
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import sys
from importlib.metadata import version

import numpy as np

MODELS = {
    "smollm2-135m": {
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "bos": None,
    },
    "gemma3-270m": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "bos": 2,
    },
}

PROMPTS = [
    "The sun was setting over the quiet town when",
    "Why do leaves change color in autumn? Leaves change color because",
    "for i in range(10):\n    print(",
    "Shopping list:\n1. Milk\n2. Eggs\n3.",
    "12 + 7 = 19, 8 + 5 =",
    "My favourite thing about summer is",
]

N_NEW = 24  # greedy tokens per prompt
N_TOP = 8  # steps that keep the top-5 ids and logits
THREADS = 2


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_meta(path):
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and len(field.data) > 1:
            continue
        if key.startswith("tokenizer.chat_template"):
            continue
        meta[key] = field.contents()
    return meta


def load_transformers(weights, file):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        weights, gguf_file=file, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    tok = AutoTokenizer.from_pretrained(weights, gguf_file=file)
    return model, tok


def check_config(name, cfg, meta):
    arch = meta["general.architecture"]
    print(f"[{name}] loaded config:\n{cfg}")
    pairs = [
        ("block_count", cfg.num_hidden_layers),
        ("embedding_length", cfg.hidden_size),
        ("feed_forward_length", cfg.intermediate_size),
        ("attention.head_count", cfg.num_attention_heads),
        ("attention.head_count_kv", cfg.num_key_value_heads),
        ("attention.layer_norm_rms_epsilon", cfg.rms_norm_eps),
    ]
    if arch == "gemma3":
        pairs += [
            ("attention.key_length", cfg.head_dim),
            ("attention.sliding_window", cfg.sliding_window),
            ("rope.freq_base", cfg.rope_parameters["full_attention"]["rope_theta"]),
        ]
    else:
        pairs += [("rope.freq_base", cfg.rope_parameters["rope_theta"])]
    for key, got in pairs:
        want = meta[f"{arch}.{key}"]
        print(f"[{name}] {arch}.{key}: gguf {want}  loaded {got}")
        assert np.isclose(float(want), float(got), rtol=1e-6), key
    if arch == "gemma3":
        want_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(cfg.num_hidden_layers)]
        assert cfg.layer_types == want_types, cfg.layer_types
        assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
        assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1000000.0
        assert cfg.rope_parameters["full_attention"].get("rope_type", "default") == "default"
        assert cfg.query_pre_attn_scalar == 256
        assert cfg.final_logit_softcapping is None and cfg.attn_logit_softcapping is None
        assert cfg._attn_implementation == "eager"
        return {
            "attention": "eager",
            "sliding_window": cfg.sliding_window,
            "layer_types": "sliding x5, full x1, repeated (layers 5, 11, 17 full)",
            "rope_theta_global": 1000000.0,
            "rope_theta_local": 10000.0,
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        }
    return {"attention": "eager", "rope_theta": cfg.rope_parameters["rope_theta"]}


def tokenize(tok, text, bos):
    ids = tok(text, add_special_tokens=True).input_ids
    if bos is None:
        assert ids[0] != tok.bos_token_id, ids
    else:
        assert ids[0] == bos and ids[1] != bos, ids
    return ids


def greedy_transformers(model, ids, eos):
    import torch

    out_ids, logits_rows = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(N_NEW):
            row = out.logits[0, -1].double().numpy()
            logits_rows.append(row)
            nxt = int(np.argmax(row))
            out_ids.append(nxt)
            if nxt == eos:
                break
            out = model(torch.tensor([[nxt]]), cache=out.cache, use_cache=True)
    return out_ids, logits_rows


def summarize(rows):
    margins, top5 = [], []
    for i, row in enumerate(rows):
        order = np.argsort(-row, kind="stable")
        margins.append(round(float(row[order[0]] - row[order[1]]), 4))
        if i < N_TOP:
            top5.append({"ids": [int(t) for t in order[:5]], "logits": [round(float(row[t]), 4) for t in order[:5]]})
    return margins, top5


def load_llamacpp(path):
    from llama_cpp import Llama

    return Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=THREADS, logits_all=True, verbose=False)


def llamacpp_f32_copy(src, dst):
    """Write dst with every tensor dequantized to float32 by llama.cpp itself."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) == 0


def llamacpp_rows(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float64)


def llamacpp_greedy(llm, ids, eos, n):
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
        if nxt == eos:
            break
        llm.eval([nxt])
    return out


def cross_check(llm, label, rec, eos):
    """Compare llama.cpp with a recorded prompt.

    top5_max_abs_diff: over the recorded top-5 ids of the first 8 steps, with llama.cpp fed
    the recorded prompt + greedy tokens in one batch; forced_argmax_agree: steps where llama.cpp's
    argmax on that batch equals the recorded greedy token; free_first_split: first step where
    llama.cpp's own greedy decode (one token per step) leaves the recorded one (null: never).
    """
    ids, greedy = rec["prompt_ids"], rec["greedy_ids"]
    rows = llamacpp_rows(llm, ids + greedy[:-1])[len(ids) - 1 :]
    diff = 0.0
    for step, t5 in enumerate(rec["top5"]):
        diff = max(diff, max(abs(float(rows[step][t]) - v) for t, v in zip(t5["ids"], t5["logits"])))
    agree = sum(int(np.argmax(r)) == g for r, g in zip(rows, greedy))
    free = llamacpp_greedy(llm, ids, eos, len(greedy))
    split = next((i for i, (a, b) in enumerate(zip(free, greedy)) if a != b), None)
    res = {
        "tokens_match": llm.tokenize(rec["text"].encode(), add_bos=True, special=False) == ids,
        "top5_max_abs_diff": round(diff, 4),
        "forced_argmax_agree": agree,
        "free_first_split": split,
    }
    print(f"[{label}] {rec['text']!r}: {res}")
    return res


def run_cross_check(name, path, prompts, eos):
    import tempfile

    import llama_cpp

    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        llamacpp_f32_copy(path, f32)
        runs = [
            ("llama_cpp_gguf", path, "the GGUF file as is; CPU matmuls quantize activations to 8 bits "
             "(Q8_0/Q8_1/Q8_K) against the quantized weights"),
            ("llama_cpp_f32", f32, "the same weights dequantized to float32 by llama_model_quantize "
             "(LLAMA_FTYPE_ALL_F32); K/V cache float16 (llama.cpp default)"),
        ]
        for label, file, what in runs:
            llm = load_llamacpp(file)
            checks = [cross_check(llm, f"{name} {label}", r, eos) for r in prompts]
            llm.close()
            result[label] = {
                "what": what,
                "top5_max_abs_diff": max(c["top5_max_abs_diff"] for c in checks),
                "per_prompt": checks,
            }
    result["tool"] = f"llama-cpp-python {llama_cpp.__version__}, CPU build, n_threads={THREADS}"
    result["fields"] = cross_check.__doc__.split("\n\n")[1].replace("\n   ", "").replace("\n", " ").strip()
    return result


def record(name, args):
    import torch
    import transformers

    spec = MODELS[name]
    path = os.path.join(args.weights, spec["file"])
    digest = sha256(path)
    assert digest == spec["sha256"], f"{path}: sha256 {digest}"
    meta = gguf_meta(path)
    torch.set_num_threads(THREADS)
    model, tok = load_transformers(args.weights, spec["file"])
    config = check_config(name, model.config, meta)
    eos = int(meta["tokenizer.ggml.eos_token_id"])

    prompts = []
    for text in PROMPTS:
        ids = tokenize(tok, text, spec["bos"])
        greedy, rows = greedy_transformers(model, ids, eos)
        margins, top5 = summarize(rows)
        rec = {"text": text, "prompt_ids": ids, "greedy_ids": greedy, "margins": margins, "top5": top5}
        print(f"[{name}] {len(ids)} prompt tokens {text!r} -> {tok.decode(greedy)!r}  min margin {min(margins):.4f}")
        prompts.append(rec)

    out = {
        "model": name,
        "file": spec["file"],
        "sha256": digest,
        "made_with": {
            "tool": "transformers AutoModelForCausalLM.from_pretrained(weights, gguf_file=file, "
            "dtype=torch.float32, attn_implementation='eager'); AutoTokenizer likewise",
            "math": "every weight dequantized to float32 by gguf-py; activations float32; "
            "greedy with KV cache, one token per step; logits are raw (no processors)",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "dtype": "float32",
            "threads": THREADS,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "python " + " ".join(["tools/record_golden.py"] + sys.argv[1:]),
            "config": config,
            "add_bos": spec["bos"] is not None,
            "eos_id": eos,
            "n_new": N_NEW,
            "top5_steps": N_TOP,
        },
        "prompts": prompts,
    }

    if args.cross_check:
        out["cross_check"] = run_cross_check(name, path, prompts, eos)

    os.makedirs(args.out, exist_ok=True)
    dest = os.path.join(args.out, f"{name}.json")
    with open(dest, "w") as f:
        f.write(dumps(out) + "\n")
    print(f"[{name}] wrote {dest} ({os.path.getsize(dest)} bytes)")


def dumps(obj, indent=0):
    """JSON with short values and number lists kept on one line."""
    flat = json.dumps(obj, ensure_ascii=False)
    numbers = isinstance(obj, list) and all(isinstance(v, (int, float)) for v in obj)
    if not isinstance(obj, (dict, list)) or numbers or len(flat) + indent < 120:
        return flat
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + dumps(v, indent + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--weights", default="weights")
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--cross-check", action="store_true", help="also run llama-cpp-python and compare")
    args = ap.parse_args()
    for name in args.models:
        record(name, args)


if __name__ == "__main__":
    main()
