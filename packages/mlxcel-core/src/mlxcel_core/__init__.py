"""mlxcel core: KV caches, the sampler chain and the generation loop on MLX.

Arrays and token ids only: nothing here tokenizes text or speaks HTTP.
"""
