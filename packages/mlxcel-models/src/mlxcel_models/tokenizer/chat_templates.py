"""Named chat templates, as llama-server users pass them to `--chat-template NAME`.

Each is the Jinja form of the template llama.cpp builds in by that name (`src/llama-chat.cpp`)
and renders the same text. Like llama.cpp's, none writes BOS: the tokenizer adds it when the
model wants it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_CHATML = """\
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

# llama.cpp's plain `llama2` has no <<SYS>> block: a system prompt opens the first turn.
_LLAMA2 = """\
{{- '[INST] ' -}}
{%- set turn = namespace(open=true) -%}
{%- for message in messages -%}
{%- if not turn.open -%}
{{- '[INST] ' -}}
{%- set turn.open = true -%}
{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\\n' -}}
{%- elif message['role'] == 'user' -%}
{{- message['content'] + ' [/INST]' -}}
{%- else -%}
{{- message['content'] + '</s>' -}}
{%- set turn.open = false -%}
{%- endif -%}
{%- endfor -%}
"""

_LLAMA2_SYS = """\
{{- '[INST] ' -}}
{%- set turn = namespace(open=true) -%}
{%- for message in messages -%}
{%- if not turn.open -%}
{{- '[INST] ' -}}
{%- set turn.open = true -%}
{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' -}}
{%- elif message['role'] == 'user' -%}
{{- message['content'] + ' [/INST]' -}}
{%- else -%}
{{- message['content'] + '</s>' -}}
{%- set turn.open = false -%}
{%- endif -%}
{%- endfor -%}
"""

_LLAMA3 = """\
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}
{{- (message['content'] | trim) + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{%- endif -%}
"""

# Gemma has no system role: system text is held and opens the next user turn.
_GEMMA = """\
{%- set system = namespace(prompt='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set system.prompt = system.prompt + (message['content'] | trim) -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\\n' -}}
{%- if system.prompt and role != 'model' -%}
{{- system.prompt + '\\n\\n' -}}
{%- set system.prompt = '' -%}
{%- endif -%}
{{- (message['content'] | trim) + '<end_of_turn>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\\n' -}}
{%- endif -%}
"""

_MISTRAL_V7 = """\
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{- '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' -}}
{%- elif message['role'] == 'user' -%}
{{- '[INST] ' + message['content'] + '[/INST]' -}}
{%- else -%}
{{- ' ' + message['content'] + '</s>' -}}
{%- endif -%}
{%- endfor -%}
"""

_PHI3 = """\
{%- for message in messages -%}
{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|assistant|>\\n' -}}
{%- endif -%}
"""

BUILTIN_CHAT_TEMPLATES: Mapping[str, str] = MappingProxyType(
    {
        "chatml": _CHATML,
        "gemma": _GEMMA,
        "llama2": _LLAMA2,
        "llama2-sys": _LLAMA2_SYS,
        "llama3": _LLAMA3,
        "mistral-v7": _MISTRAL_V7,
        "phi3": _PHI3,
    }
)
"""Jinja chat templates by llama.cpp's `--chat-template` name."""


def resolve_chat_template(name_or_jinja: str) -> str:
    """The Jinja text for a `--chat-template` value: a built-in name, or a template itself.

    Raises:
        ValueError: `name_or_jinja` is neither a built-in name nor Jinja (no `{%` or `{{`).
    """
    template = BUILTIN_CHAT_TEMPLATES.get(name_or_jinja)
    if template is not None:
        return template
    if "{%" in name_or_jinja or "{{" in name_or_jinja:
        return name_or_jinja
    raise ValueError(
        f"chat_template must be a built-in name ({', '.join(BUILTIN_CHAT_TEMPLATES)}) "
        f"or a Jinja template, got {name_or_jinja!r}"
    )
