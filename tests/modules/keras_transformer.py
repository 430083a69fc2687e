"""A transformer encoder block in Keras: the model on which make demo shows
tf_op.compile against TF, and one of the peers benchmark's models."""

from __future__ import annotations

import functools

import keras

#: 64 tokens of 128 features.
INPUT_SHAPE = (64, 128)


def build_model() -> keras.Model:
    """A post-norm encoder block: attention (4 heads of 32), FFN 128-512-128, exact gelu."""
    x = keras.Input(INPUT_SHAPE)
    h = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(num_heads=4, key_dim=32)(x, x))
    gelu = functools.partial(keras.activations.gelu, approximate=False)
    ffn = keras.layers.Dense(128)(keras.layers.Dense(512, activation=gelu)(h))
    return keras.Model(x, keras.layers.LayerNormalization()(h + ffn), name="encoder")
