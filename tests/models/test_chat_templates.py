"""Chat templates: parity with transformers, the built-in named templates, name resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jinja2 import TemplateError
from transformers import AutoTokenizer

from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.tokenizer import BUILTIN_CHAT_TEMPLATES, Tokenizer, resolve_chat_template

# The Llama 2 chat template as published with the model: BOS/EOS variables, strip(), and an
# exception when roles do not alternate.
LLAMA2_HF_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)
TOOLS_TEMPLATE = (
    "{% if tools %}{{ 'tools: ' + (tools | map(attribute='function.name') | join(',')) + '\\n' }}"
    "{% endif %}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}{{ flavour | default('') }}"
)

SYSTEM_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
]
MULTI_TURN = [
    *SYSTEM_USER,
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]
CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2+2?"}],
    "system_user": SYSTEM_USER,
    "multi_turn": MULTI_TURN,
    "same_role_twice": [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ],
}


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(read_gguf_header(smollm2_path, arrays=True).metadata)


@pytest.fixture(scope="module")
def transformers_tokenizer(smollm2: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same tokenizer loaded independently, through transformers' AutoTokenizer."""
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    smollm2.hf_tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _templates(smollm2: Tokenizer) -> dict[str, str]:
    return {
        "model": smollm2.chat_template,
        "llama2-hf": LLAMA2_HF_TEMPLATE,
        **BUILTIN_CHAT_TEMPLATES,
    }


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("template_name", ["model", "llama2-hf", *sorted(BUILTIN_CHAT_TEMPLATES)])
def test_rendering_matches_transformers(
    smollm2, transformers_tokenizer, template_name, conversation, add_generation_prompt
):
    template = _templates(smollm2)[template_name]
    messages = CONVERSATIONS[conversation]
    try:
        expected = transformers_tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
    except TemplateError as error:
        with pytest.raises(ValueError, match=str(error)):
            smollm2.apply_chat_template(
                messages, chat_template=template, add_generation_prompt=add_generation_prompt
            )
        return
    rendered = smollm2.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=add_generation_prompt
    )
    assert rendered == expected


def test_tools_and_template_variables_reach_the_template(smollm2, transformers_tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    rendered = smollm2.apply_chat_template(
        SYSTEM_USER,
        chat_template=TOOLS_TEMPLATE,
        tools=tools,
        template_kwargs={"flavour": "!"},
    )
    assert rendered == "tools: get_weather\nsystem: You are terse.\nuser: Hi\nassistant:!"
    assert rendered == transformers_tokenizer.apply_chat_template(
        SYSTEM_USER,
        chat_template=TOOLS_TEMPLATE,
        tools=tools,
        flavour="!",
        tokenize=False,
        add_generation_prompt=True,
    )


def test_llama2_hf_template_writes_bos_and_eos(smollm2):
    rendered = smollm2.apply_chat_template(MULTI_TURN, chat_template=LLAMA2_HF_TEMPLATE)
    assert rendered == (
        "<|im_start|>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello! <|im_end|>"
        "<|im_start|>[INST] Bye [/INST]"
    )


BUILTIN_EXPECTED = {
    "chatml": (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n",
        "<|im_start|>assistant\n",
    ),
    "llama2": ("[INST] You are terse.\nHi [/INST]Hello!</s>[INST] Bye [/INST]", ""),
    "llama2-sys": (
        "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]",
        "",
    ),
    "llama3": (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "gemma": (
        "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n",
        "<start_of_turn>model\n",
    ),
    "mistral-v7": (
        "[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT]"
        "[INST] Hi[/INST] Hello!</s>[INST] Bye[/INST]",
        "",
    ),
    "phi3": (
        "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
        "<|user|>\nBye<|end|>\n",
        "<|assistant|>\n",
    ),
}


def test_every_builtin_template_has_an_expected_rendering():
    assert set(BUILTIN_EXPECTED) == set(BUILTIN_CHAT_TEMPLATES)


@pytest.mark.parametrize("name", sorted(BUILTIN_EXPECTED))
def test_builtin_templates_render_as_llama_cpp(smollm2, name):
    body, generation_prompt = BUILTIN_EXPECTED[name]
    template = resolve_chat_template(name)
    assert (
        smollm2.apply_chat_template(MULTI_TURN, chat_template=template, add_generation_prompt=False)
        == body
    )
    assert smollm2.apply_chat_template(MULTI_TURN, chat_template=template) == (
        body + generation_prompt
    )


@pytest.mark.parametrize("name", ["llama3", "gemma"])
def test_trimming_builtin_templates_trim_content(smollm2, name):
    padded = [{"role": "user", "content": "  Hi \n"}]
    rendered = smollm2.apply_chat_template(padded, chat_template=BUILTIN_CHAT_TEMPLATES[name])
    assert "\nHi<" in rendered and "  Hi" not in rendered


def test_resolve_chat_template_accepts_jinja_and_names():
    assert resolve_chat_template("chatml") == BUILTIN_CHAT_TEMPLATES["chatml"]
    assert resolve_chat_template("{{ messages }}") == "{{ messages }}"
    assert resolve_chat_template("{% for m in messages %}x{% endfor %}").startswith("{%")


def test_resolve_chat_template_lists_names_for_unknown_text():
    with pytest.raises(ValueError, match="chat_template") as error:
        resolve_chat_template("vicuna-9000")
    assert "'vicuna-9000'" in str(error.value)
    assert all(name in str(error.value) for name in BUILTIN_CHAT_TEMPLATES)


def test_missing_template_is_a_clear_error():
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0],
        "tokenizer.ggml.token_type": [2, 3, 3, 1],
    }
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    assert tokenizer.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "a"}])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a"}], chat_template=resolve_chat_template("chatml")
    )
    assert rendered == "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"
