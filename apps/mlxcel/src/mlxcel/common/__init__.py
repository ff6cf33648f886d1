"""What several commands share: llama-server's flag machinery, the flags of the engine, kernels,
memory check, adapters, surgery, GGUF, images and chat templates, and loading the model a
command names."""
