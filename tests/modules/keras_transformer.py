"""A transformer encoder block in Keras: the model on which make demo shows
tf_op.compile against TF, and one of the peers benchmark's models."""

from __future__ import annotations

import functools

import keras

#: 64 tokens of 128 features.
INPUT_SHAPE = (64, 128)


def build_model(tokens: int = INPUT_SHAPE[0], width: int = INPUT_SHAPE[1], heads: int = 4, ffn_width: int = 512,
                name: str = "encoder") -> keras.Model:
    """A post-norm encoder block: attention (``heads`` heads of ``width / heads``), FFN
    width-ffn_width-width, exact gelu. By default 4 heads of 32 and FFN 128-512-128."""
    x = keras.Input((tokens, width))
    attention = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads)
    h = keras.layers.LayerNormalization()(x + attention(x, x))
    gelu = functools.partial(keras.activations.gelu, approximate=False)
    ffn = keras.layers.Dense(width)(keras.layers.Dense(ffn_width, activation=gelu)(h))
    return keras.Model(x, keras.layers.LayerNormalization()(h + ffn), name=name)
