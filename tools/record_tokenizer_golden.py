"""Record reference token ids for tests/test_tokenizer.py from llama.cpp's own tokenizer.

Runs in an environment with llama-cpp-python (not ours, not the `tokenizers` package): the
model is opened with vocab_only=True and each string is tokenized with add_bos=True,
special=True (special-token text such as '<|im_start|>' becomes that token, as in a chat prompt).

    python tools/record_tokenizer_golden.py            # both models, from GLIMMER_CACHE or weights/
    python tools/record_tokenizer_golden.py --models smollm2-135m
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}

# Chosen to cross every branch of the pre-tokenizers and the SPM merge loop: scripts with and
# without spaces, combining marks, emoji sequences, whitespace runs of each kind, digit runs,
# contractions, code, and special-token text (each model's own and the other's).
STRINGS = [
    "",
    " ",
    "Hello world!",
    "Hello, World! How are you today?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "two  spaces   three    four",
    " " * 40 + "forty spaces",
    "tab\there\t\tand\t\t\tthree",
    "line one\nline two\n\nline four\n\n\n\nend\n",
    "windows\r\nline\r\nendings",
    "mixed \t \n \t\n  whitespace",
    "don't I'M we'll they're she's I'd you've 'quoted'",
    "1 12 123 1234 12345 123456789012345678901234567890",
    "3.14159 -2.5e-10 $1,234.56 100% 0x1F 1/2",
    "naïve café résumé Ångström façade",
    "e\u0301 vs \u00e9 (combining accent)",
    "Ελληνικά, русский текст, עברית, العربية",
    "中文测试：你好，世界！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "हिन्दी और தமிழ்",
    "emoji 🙂 👍🏽 👨\u200d👩\u200d👧 🇫🇷 ❤️",
    "zero\u200bwidth and\u00a0nbsp",
    "def add(a, b):\n    return a + b  # sum\n",
    "for (int i = 0; i < n; ++i) { x[i] *= 2; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "https://example.com/path?q=1&r=two#frag",
    "<html><body class=\"x\">text</body></html>",
    "ALL CAPS and camelCaseWords and snake_case_words",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|endoftext|>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>literal bos and <eos> and <pad>",
    "<0x41> <unk> [multimodal] <unused0>",
    "a" * 64,
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def llama_cpp_tokenizer(path: Path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tool = {"tool": "llama-cpp-python", "version": llama_cpp.__version__,
            "call": "Llama(model_path, vocab_only=True).tokenize(text.encode('utf-8'), add_bos=True, special=True)"}
    return tool, lambda text: llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def transformers_tokenizer(path: Path):
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tool = {"tool": "transformers", "version": transformers.__version__,
            "call": "AutoTokenizer.from_pretrained(dir, gguf_file=name)(text, add_special_tokens=True)"}
    return tool, lambda text: tok(text, add_special_tokens=True)["input_ids"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--cache", default=os.environ.get("GLIMMER_CACHE", str(REPO / "weights")))
    ap.add_argument("--transformers", action="store_true",
                    help="use transformers' GGUF tokenizer instead of llama-cpp-python")
    ap.add_argument("--out", default=str(REPO / "tests" / "golden"))
    args = ap.parse_args()

    for name in args.models:
        path = Path(args.cache) / MODELS[name]
        make = transformers_tokenizer if args.transformers else llama_cpp_tokenizer
        tool, tokenize = make(path)
        record = {
            "model": name,
            "file": path.name,
            "sha256": sha256_of(path),
            **tool,
            "date": datetime.date.today().isoformat(),
            "made_by": "tools/record_tokenizer_golden.py",
            "cases": [{"text": s, "ids": list(tokenize(s))} for s in STRINGS],
        }
        out = Path(args.out) / f"tokenizer_{name}.json"
        # one case per line: small, and a changed id shows as a one-line diff
        head = {k: v for k, v in record.items() if k != "cases"}
        lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
        lines += [json.dumps(c, ensure_ascii=False) + "," for c in record["cases"]]
        lines[-1] = lines[-1][:-1]
        lines.append("]}")
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{out}: {len(record['cases'])} strings, {tool['tool']} {tool['version']}")


if __name__ == "__main__":
    main()
