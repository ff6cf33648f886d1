"""mlxcel vision: image inputs, processors, vision encoders and connectors for vision-language
models."""
