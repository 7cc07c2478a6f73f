"""The tokenizer a GGUF file describes, built as a `tokenizers.Tokenizer`.

Two vocabulary kinds, named by `tokenizer.ggml.model`:
- `gpt2`: byte-level BPE with the file's merges; text is split by the regexes llama.cpp uses for
  the file's `tokenizer.ggml.pre` (llama-vocab.cpp, llm_tokenizer_bpe), then byte-mapped.
- `llama`: SentencePiece BPE with scores (Llama 1/2, Gemma). llama.cpp merges the adjacent pair
  whose merged piece has the highest score; a BPE whose merges are every split of every token,
  ranked by the merged token's score, makes the same choices. Spaces are '▁', characters not in
  the vocabulary fall back to <0xNN> byte tokens.

Tokens typed control (3), unknown (2) or user-defined (4) are matched whole in the text before
anything else, as llama.cpp does when it parses special tokens; control and unknown ones are dropped by
`decode(skip_special=True)`, user-defined ones (Gemma's runs of spaces and newlines) are text.
Decoding goes through a per-token byte table, so streaming and whole decoding agree byte for byte.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..errors import GGUFError, UnsupportedError

# llama.cpp token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL = (CONTROL, UNKNOWN)   # matched in text, dropped by decode(skip_special=True)

# Pre-tokenizer regexes from llama.cpp's llm_tokenizer_bpe, applied one after another.
# The case-insensitive contractions of llama3/qwen2 are spelled (?i:...) as in the models'
# tokenizer.json; llama.cpp writes them out as '[sS]' etc., which matches the same text.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

# tokenizer.ggml.pre -> (regexes, ignore_merges). ignore_merges: a word that is a token is
# taken whole before any merge (llama.cpp sets it for llama3).
PRE_TOKENIZERS = {
    "default": (_DEFAULT, False),
    "gpt-2": ((_GPT2,), False),
    "gpt2": ((_GPT2,), False),
    "phi-2": ((_GPT2,), False),
    "mpt": ((_GPT2,), False),
    "olmo": ((_GPT2,), False),
    "smollm": ((r"\p{N}", _GPT2), False),
    "starcoder": ((r"\p{N}", _GPT2), False),
    "refact": ((r"\p{N}", _GPT2), False),
    "llama3": ((_LLAMA3,), True),
    "llama-v3": ((_LLAMA3,), True),
    "llama-bpe": ((_LLAMA3,), True),
    "dbrx": ((_LLAMA3,), False),
    "smaug-bpe": ((_LLAMA3,), False),
    "qwen2": ((_QWEN2,), False),
    "deepseek-r1-qwen": ((_QWEN2,), False),
    "stablelm2": ((_QWEN2,), False),
}

# Turn-ending tokens that stop a chat reply besides the file's eos (llama.cpp's EOG list).
END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
               "<|endoftext|>", "<|end_of_text|>", "<EOT>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _spm_merges(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) split of every token whose halves are tokens, best merged score first.

    llama.cpp's SPM loop merges the adjacent pair whose concatenation is the highest-scoring
    token, so ranking merges by that score reproduces it. Equal scores go to the lower token id
    (llama.cpp takes the leftmost pair instead; normal tokens' scores are distinct in practice).
    """
    ranked = []
    for tid, (tok, score) in enumerate(zip(tokens, scores)):
        for i in range(1, len(tok)):
            left = tok[:i]
            if left in vocab:
                right = tok[i:]
                if right in vocab:
                    ranked.append((-score, tid, i))
    ranked.sort()
    return [(tokens[tid][:i], tokens[tid][i:]) for _, tid, i in ranked]


def _list(metadata: dict, key: str, n: int | None = None) -> list:
    value = metadata.get(key)
    if not isinstance(value, list):
        raise GGUFError(f"tokenizer metadata {key} is missing or not a list")
    if n is not None and len(value) != n:
        raise GGUFError(f"tokenizer metadata {key} has {len(value)} entries, the vocabulary {n}")
    return value


def _types(metadata: dict, n: int) -> list[int]:
    if "tokenizer.ggml.token_type" not in metadata:
        return [NORMAL] * n
    return _list(metadata, "tokenizer.ggml.token_type", n)


class Tokenizer:
    """Text <-> token ids for one model, built from GGUF metadata (see `from_gguf`)."""

    def __init__(self, hf: HFTokenizer, tokens: list[str], token_types: list[int], token_bytes: list[bytes],
                 bos_id: int | None, eos_id: int | None, add_bos: bool, add_eos: bool, strip_space_prefix: bool,
                 end_ids: Iterable[int] = ()):
        self.hf = hf
        self.tokens = tokens
        self.token_types = token_types
        self.token_bytes = token_bytes          # what each token decodes to
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.strip_space_prefix = strip_space_prefix
        self._ids = {t: i for i, t in enumerate(tokens)}
        # ids that end a reply: eos, the file's eot/eom, and turn-end tokens by name
        self.eos_ids = {i for i in (eos_id, *end_ids) if i is not None}
        self.eos_ids |= {self._ids[t] for t in END_OF_TURN if t in self._ids}

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, metadata: dict[str, object]) -> Tokenizer:
        model = metadata.get("tokenizer.ggml.model")
        if model == "gpt2":
            return cls._byte_level_bpe(metadata)
        if model == "llama":
            return cls._sentencepiece_bpe(metadata)
        raise UnsupportedError(f"tokenizer model {model!r} is not supported (supported: gpt2, llama)")

    @classmethod
    def _byte_level_bpe(cls, md: dict) -> Tokenizer:
        pre = md.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise UnsupportedError(f"gpt2 tokenizer with pre-tokenizer {pre!r} is not supported "
                                   f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
        regexes, ignore_merges = PRE_TOKENIZERS[pre]
        tokens = _list(md, "tokenizer.ggml.tokens")
        types = _types(md, len(tokens))
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in _list(md, "tokenizer.ggml.merges")]
        hf = HFTokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()
        byte_of = {c: b for b, c in bytes_to_unicode().items()}

        def to_bytes(tok: str, ttype: int) -> bytes:
            if ttype in (*SPECIAL, USER_DEFINED) or any(c not in byte_of for c in tok):
                return tok.encode("utf-8")   # added tokens are plain text, not byte-mapped
            return bytes(byte_of[c] for c in tok)

        token_bytes = [to_bytes(t, ty) for t, ty in zip(tokens, types)]
        return cls._finish(hf, md, tokens, types, token_bytes, add_bos_default=pre in ("llama3", "llama-v3", "llama-bpe"),
                           strip_space_prefix=False)

    @classmethod
    def _sentencepiece_bpe(cls, md: dict) -> Tokenizer:
        tokens = _list(md, "tokenizer.ggml.tokens")
        scores = _list(md, "tokenizer.ggml.scores", len(tokens))
        types = _types(md, len(tokens))
        vocab = {t: i for i, t in enumerate(tokens)}
        unk_id = md.get("tokenizer.ggml.unknown_token_id")
        unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
        hf = HFTokenizer(models.BPE(vocab, _spm_merges(tokens, scores, vocab), unk_token=unk,
                                    byte_fallback=True, fuse_unk=True))
        space_prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
        # llama.cpp prefixes a space to every text fragment that follows a special token (or
        # starts the text); the normalizer runs per fragment between added tokens, which is the same.
        norm = [normalizers.Replace(" ", "▁")]
        hf.normalizer = normalizers.Sequence(([normalizers.Prepend("▁")] if space_prefix else []) + norm)
        hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                       + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))

        def to_bytes(tok: str, ttype: int) -> bytes:
            if ttype == BYTE and len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                return bytes([int(tok[3:5], 16)])
            if ttype in (*SPECIAL, USER_DEFINED):
                return tok.encode("utf-8")
            return tok.replace("▁", " ").encode("utf-8")

        token_bytes = [to_bytes(t, ty) for t, ty in zip(tokens, types)]
        return cls._finish(hf, md, tokens, types, token_bytes, add_bos_default=True, strip_space_prefix=space_prefix)

    @classmethod
    def _finish(cls, hf, md, tokens, types, token_bytes, add_bos_default, strip_space_prefix) -> Tokenizer:
        # Whole-text matches first: control/unknown tokens are special (skipped when decoding with
        # skip_special), user-defined ones are ordinary text. normalized=False: matched in the raw text.
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, ty in zip(tokens, types) if ty in SPECIAL])
        hf.add_tokens([AddedToken(t, special=False, normalized=False)
                       for t, ty in zip(tokens, types) if ty == USER_DEFINED])
        n = len(tokens)

        def token_id(key):
            v = md.get(key)
            if v is None:
                return None
            if not isinstance(v, int) or not 0 <= v < n:
                raise GGUFError(f"tokenizer metadata {key} = {v!r} is not a token id below {n}")
            return v

        bos_id = token_id("tokenizer.ggml.bos_token_id")
        eos_id = token_id("tokenizer.ggml.eos_token_id")
        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos_id is not None
        add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
        end_ids = (token_id("tokenizer.ggml.eot_token_id"), token_id("tokenizer.ggml.eom_token_id"))
        return cls(hf, tokens, list(types), token_bytes, bos_id, eos_id, add_bos, add_eos, strip_space_prefix, end_ids)

    # --- API ----------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def bos_token(self) -> str:
        """BOS as text ('' when the vocabulary has none), for chat templates."""
        return self.tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_token(self) -> str:
        return self.tokens[self.eos_id] if self.eos_id is not None else ""

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        return self.tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        return self.token_types[token_id] in SPECIAL

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; special-token text like '<|im_start|>' becomes that one token.
        add_special adds BOS (and EOS) where the file asks for them."""
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.add_bos:
                ids = [self.bos_id] + ids
            if self.add_eos:
                ids = ids + [self.eos_id]
        return ids

    def _piece_bytes(self, ids: Iterable[int], skip_special: bool) -> Iterator[bytes]:
        for i in ids:
            if skip_special and self.token_types[i] in SPECIAL:
                continue
            yield self.token_bytes[i]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids`; bytes that do not form UTF-8 become U+FFFD."""
        text = b"".join(self._piece_bytes(ids, skip_special)).decode("utf-8", errors="replace")
        if self.strip_space_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def stream(self, skip_special: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Turns ids arriving one at a time into text pieces, never splitting a UTF-8 character:
    bytes of an unfinished character wait for the next token. The pieces concatenate to
    `tokenizer.decode(all_ids)`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self.tok = tokenizer
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = tokenizer.strip_space_prefix  # drop the prefix space of the first text

    def push(self, token_id: int) -> str:
        if self.skip_special and self.tok.token_types[token_id] in SPECIAL:
            return ""
        return self._emit(self._utf8.decode(self.tok.token_bytes[token_id]))

    def flush(self) -> str:
        """Text held back at the end of the stream (an unfinished character becomes U+FFFD)."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._first and text:
            self._first = False
            if text.startswith(" "):
                text = text[1:]
        return text
