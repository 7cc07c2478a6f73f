"""Chat templates: the Jinja template a GGUF file carries, rendered in a sandbox.

A model file is untrusted input and its template is code, so it runs in jinja2's
ImmutableSandboxedEnvironment (no attribute tricks into Python internals, no mutating the
messages), with the options and helpers transformers gives templates (trim_blocks,
lstrip_blocks, loop controls, raise_exception, tojson, strftime_now).
"""

from __future__ import annotations

import datetime
import json
from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import GlimmerError

# Gemma 3's template, for files that carry none (the instruction-tuned model's format; a system
# message is folded into the first user turn, as Gemma has no system role).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

BUILTIN_TEMPLATES = {"gemma3": GEMMA3_TEMPLATE}


class _TemplateRaised(Exception):
    """raise_exception() called by a template."""


def _raise_exception(message):
    raise _TemplateRaised(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    # templates expect non-ASCII kept as is (transformers' tojson), not jinja's HTML-safe form
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra) -> str:
    """Render `messages` ([{'role': ..., 'content': ...}, ...]) with a chat template.

    The text holds whatever special-token text the template writes (e.g. '<bos>'), so encode it
    with add_special=False or use `encode_chat`, which adds BOS only where the text lacks it.
    Any template failure, including a sandbox refusal, is a GlimmerError.
    """
    try:
        compiled = _compile(template)
    except jinja2.TemplateSyntaxError as e:
        raise GlimmerError(f"chat template does not parse (line {e.lineno}): {_one_line(e)}") from None
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except _TemplateRaised as e:
        raise GlimmerError(f"chat template refused the messages: {_one_line(e)}") from None
    except jinja2.exceptions.SecurityError as e:
        raise GlimmerError(f"chat template blocked by the sandbox: {_one_line(e)}") from None
    except Exception as e:  # a template can fail in any way its code allows (TypeError, KeyError, ...)
        raise GlimmerError(f"chat template failed: {type(e).__name__}: {_one_line(e)}") from None


def chat_template_for(metadata: dict[str, object]) -> str | None:
    """The file's chat template, else a built-in one for its architecture, else None."""
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        return template
    return BUILTIN_TEMPLATES.get(str(metadata.get("general.architecture", "")))


def encode_chat(tokenizer, template: str, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Prompt ids for `messages`: rendered with the tokenizer's BOS/EOS text, BOS added only
    when the tokenizer wants one and the template did not write it."""
    text = render_chat(template, messages, add_generation_prompt,
                       bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
    ids = tokenizer.encode(text, add_special=False)
    if tokenizer.add_bos and (not ids or ids[0] != tokenizer.bos_id):
        ids = [tokenizer.bos_id] + ids
    return ids
