"""mlxcel models: detection, metadata, GGUF and safetensors loaders, tokenizers, chat templates."""
