"""Chat templates: the file's template renders the model's format; the sandbox holds."""

from __future__ import annotations

import pytest

from glimmer_cupy.errors import GlimmerError
from glimmer_cupy.model.chat import (
    GEMMA3_TEMPLATE,
    chat_template_for,
    encode_chat,
    render_chat,
)
from glimmer_cupy.model.tokenizer import Tokenizer

CHAT = [{"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"}]


@pytest.mark.model
def test_smollm2_template_renders_chatml(gguf_metadata):
    template = chat_template_for(gguf_metadata("smollm2-135m"))
    assert render_chat(template, CHAT) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n")
    with_system = [{"role": "system", "content": "Be brief."}] + CHAT[:1]
    assert render_chat(template, with_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n")


@pytest.mark.model
def test_smollm2_chat_ids(gguf_metadata):
    metadata = gguf_metadata("smollm2-135m")
    tok = Tokenizer.from_gguf(metadata)
    ids = encode_chat(tok, chat_template_for(metadata), CHAT[:1])
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert im_end in tok.eos_ids


def test_gemma3_builtin_template():
    template = chat_template_for({"general.architecture": "gemma3"})
    assert template == GEMMA3_TEMPLATE
    system = [{"role": "system", "content": "Be brief."}]
    assert render_chat(template, system + CHAT, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n")
    with pytest.raises(GlimmerError, match="alternate"):
        render_chat(template, [{"role": "assistant", "content": "x"}])


def test_file_template_wins_and_none_without_one():
    assert chat_template_for({"general.architecture": "gemma3", "tokenizer.chat_template": "{{ 1 }}"}) == "{{ 1 }}"
    assert chat_template_for({"general.architecture": "llama"}) is None


def test_trim_and_lstrip_blocks():
    template = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    assert render_chat(template, CHAT) == "[Hi there]\n[2+2?]\n"


@pytest.mark.parametrize("attack", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
])
def test_sandbox_refuses(attack):
    with pytest.raises(GlimmerError) as err:
        render_chat(attack, CHAT)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}", "does not parse"),
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("{{ messages[0]['content'] + 1 }}", "TypeError"),
])
def test_template_errors_are_one_line(template, message):
    with pytest.raises(GlimmerError, match=message) as err:
        render_chat(template, CHAT)
    assert "\n" not in str(err.value)


def test_encode_chat_adds_bos_once():
    # a small SentencePiece vocabulary with Gemma's special tokens; the template writes <bos>
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["\n"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", *"abcdefghijklmnopqrstuvwxyz"]
    tokens = specials + pieces
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.scores": [0.0] * len(tokens),
                "tokenizer.ggml.token_type": [3] * 6 + [4] + [6] * 256 + [1] * 27,
                "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
                "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False}
    tok = Tokenizer.from_gguf(metadata)
    ids = encode_chat(tok, GEMMA3_TEMPLATE, [{"role": "user", "content": "hi"}])
    assert [tok.id_to_token(i) for i in ids] == [
        "<bos>", "<start_of_turn>", "u", "s", "e", "r", "\n", "h", "i", "<end_of_turn>", "\n",
        "<start_of_turn>", "m", "o", "d", "e", "l", "\n"]
    # a template that writes no BOS still gets one, since the vocabulary asks for it
    assert encode_chat(tok, "{{ messages[0]['content'] }}", [{"role": "user", "content": "hi"}])[0] == 2
