"""mlxcel models: detection, metadata, GGUF and safetensors loaders, tokenizers and chat templates."""
