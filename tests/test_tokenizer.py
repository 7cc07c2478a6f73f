"""Tokenizer from GGUF metadata: ids equal llama.cpp's (recorded goldens), decoding round-trips,
streaming decoding never splits a character and adds up to the whole decode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glimmer_cupy.errors import UnsupportedError
from glimmer_cupy.model.tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    PRE_TOKENIZERS,
    Tokenizer,
    bytes_to_unicode,
)

GOLDEN = Path(__file__).parent / "golden"
MODELS = ("smollm2-135m", "gemma3-270m")


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def tokenizer_for(gguf_metadata):
    """tokenizer_for(name) -> Tokenizer, built once per session (Gemma's takes seconds)."""
    cache = {}

    def get(name: str) -> Tokenizer:
        if name not in cache:
            cache[name] = Tokenizer.from_gguf(gguf_metadata(name))
        return cache[name]
    return get


# --- real models -------------------------------------------------------------------------------

@pytest.mark.model
@pytest.mark.parametrize("name", MODELS)
def test_ids_equal_llama_cpp(tokenizer_for, name):
    tok, record = tokenizer_for(name), golden(name)
    from glimmer_cupy.weights.fetch import MODELS as SOURCES
    assert record["sha256"] == SOURCES[name].sha256, "golden was recorded from another file"
    wrong = []
    for case in record["cases"]:
        ours = tok.encode(case["text"])
        if ours != case["ids"]:
            wrong.append(f"{case['text']!r}: ours {ours} reference {case['ids']}")
    assert not wrong, f"{len(wrong)} of {len(record['cases'])} strings differ:\n" + "\n".join(wrong)


@pytest.mark.model
@pytest.mark.parametrize("name", MODELS)
def test_decode_round_trips(tokenizer_for, name):
    tok = tokenizer_for(name)
    for case in golden(name)["cases"]:
        text = case["text"]
        assert tok.decode(tok.encode(text, add_special=False), skip_special=False) == text
        # our byte-table decode agrees with the tokenizers decoder it sits beside
        ids = tok.encode(text)
        assert tok.decode(ids) == tok.hf.decode(ids, skip_special_tokens=True), text


@pytest.mark.model
@pytest.mark.parametrize("name", MODELS)
def test_stream_concatenates_to_decode(tokenizer_for, name):
    tok = tokenizer_for(name)
    for case in golden(name)["cases"]:
        ids = tok.encode(case["text"])
        for skip in (True, False):
            stream = tok.stream(skip_special=skip)
            pieces = [stream.push(i) for i in ids] + [stream.flush()]
            assert "".join(pieces) == tok.decode(ids, skip_special=skip)
            assert not any("\ufffd" in p for p in pieces), case["text"]


@pytest.mark.model
def test_stream_holds_partial_characters(tokenizer_for):
    tok = tokenizer_for("gemma3-270m")
    # one byte token per UTF-8 byte of a 3-byte character: nothing until the last byte
    byte_ids = [tok.token_to_id(f"<0x{b:02X}>") for b in "€".encode()]
    assert all(tok.token_types[i] == BYTE for i in byte_ids)
    stream = tok.stream()
    assert [stream.push(i) for i in byte_ids] == ["", "", "€"]
    # a cut-off character at the end of the stream becomes U+FFFD on flush
    stream = tok.stream()
    assert stream.push(byte_ids[0]) == "" and stream.flush() == "\ufffd"


@pytest.mark.model
def test_smollm2_specials(tokenizer_for):
    tok = tokenizer_for("smollm2-135m")
    assert tok.vocab_size == 49152
    assert tok.bos_id == 1 and not tok.add_bos
    assert {2, tok.token_to_id("<|im_end|>")} <= tok.eos_ids
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|im_end|>")
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special=False) == "<|im_start|>user\nhi<|im_end|>"


@pytest.mark.model
def test_gemma3_specials(tokenizer_for):
    tok = tokenizer_for("gemma3-270m")
    assert tok.vocab_size == 262144
    assert tok.add_bos and tok.encode("hi")[0] == tok.bos_id == tok.token_to_id("<bos>")
    assert tok.encode("hi", add_special=False)[0] != tok.bos_id
    assert {tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>")} <= tok.eos_ids
    assert tok.id_to_token(tok.token_to_id("<start_of_turn>")) == "<start_of_turn>"
    assert tok.token_types[tok.token_to_id("<start_of_turn>")] == CONTROL
    # newlines are user-defined tokens: text, kept by decode
    assert tok.decode(tok.encode("a\nb")) == "a\nb"


# --- synthetic vocabularies: no model file -----------------------------------------------------

def spm_metadata(pieces: dict[str, float], **extra) -> dict:
    """A tiny SentencePiece vocabulary: specials, the 256 byte tokens, then `pieces`."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    types = [2, 3, 3] + [BYTE] * 256 + [NORMAL] * len(pieces)
    scores = [0.0] * 259 + list(pieces.values())
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, **extra}


def test_spm_merges_follow_score_not_file_order():
    # 'ab' comes first in the file but 'bc' scores higher, so llama.cpp merges b+c first
    tok = Tokenizer.from_gguf(spm_metadata({"▁": -1, "a": -2, "b": -3, "c": -4, "ab": -9, "bc": -5},
                                           **{"tokenizer.ggml.add_space_prefix": False}))
    assert [tok.id_to_token(i) for i in tok.encode("abc", add_special=False)] == ["a", "bc"]
    assert tok.encode("abc")[0] == tok.bos_id  # add_bos defaults to true for SentencePiece


def test_spm_space_prefix_and_byte_fallback():
    tok = Tokenizer.from_gguf(spm_metadata({"▁": -1, "a": -2, "▁a": -3},
                                           **{"tokenizer.ggml.add_space_prefix": True}))
    ids = tok.encode("a é", add_special=False)
    assert [tok.id_to_token(i) for i in ids] == ["▁a", "▁", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "a é"
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) == "a é"


def test_unsupported_tokenizer_model():
    with pytest.raises(UnsupportedError, match="'bert'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "bert"})
    with pytest.raises(UnsupportedError, match="'no-such-pre'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre"})


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_builds_and_round_trips(pre):
    # 256 single-byte tokens, one merge: each regex compiles and text survives the byte mapping
    alphabet = [bytes_to_unicode()[b] for b in range(256)]
    tok = Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                               "tokenizer.ggml.tokens": alphabet + ["he", "<|eot|>"],
                               "tokenizer.ggml.token_type": [NORMAL] * 257 + [CONTROL],
                               "tokenizer.ggml.merges": ["h e"], "tokenizer.ggml.eos_token_id": 257})
    text = "he said: I'M 12345 héllo 世界\n\n  tabs\t\there<|eot|>"
    ids = tok.encode(text)
    assert ids[0] == 256 and ids[-1] == 257 == tok.eos_id
    assert tok.decode(ids, skip_special=False) == text
