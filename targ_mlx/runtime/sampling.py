"""Choosing each decoded token, with the gate's per-step statistics, in one call per step.

`select(logits, inv_temp, u)` returns, per row of (B, V) logits: the token (argmax where
inv_temp is 0, else a sample from softmax(logits * inv_temp) by inverse CDF at the uniform u),
the entropy of softmax(logits), the top-1 minus top-2 logit gap, and the token's log-probability
under softmax(logits). This module is the MLX version (any device); on CPU the backbone uses
the fused kernel `targ_mlx.runtime.native` provides, which computes the same values in one pass.

Sampling by inverse CDF from an explicit uniform, rather than `mx.random.categorical`, makes
both versions draw the same token for the same seed, and costs one random number per row.
"""

from __future__ import annotations

import mlx.core as mx



def step_entropy(logits: mx.array) -> mx.array:
    """Entropy of softmax(logits) along the last axis, in nats (the entropy gate's H_t).

    H = log Z - E_p[l - max l], with one exp pass: MLX's CPU exp is scalar (~1.8 ms per
    49k-token row here), so the logsumexp-then-exp form cost twice as much per draft step.
    """
    shifted = logits - mx.max(logits, axis=-1, keepdims=True)
    e = mx.exp(shifted)
    z = mx.sum(e, axis=-1)
    return mx.log(z) - mx.sum(e * shifted, axis=-1) / z


def step_gap(logits: mx.array) -> mx.array:
    """Top-1 minus top-2 logit along the last axis (the margin gate's g_t; mx.topk does not sort)."""
    top2 = mx.topk(logits, 2, axis=-1)
    return mx.max(top2, axis=-1) - mx.min(top2, axis=-1)


@mx.compile
def select(logits: mx.array, inv_temp: mx.array, u: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(token int32, entropy, gap, log-probability), each (B,); see the module docstring."""
    logits = logits.astype(mx.float32)
    m = mx.max(logits, axis=-1, keepdims=True)
    greedy = mx.argmax(logits, axis=-1)
    p = mx.exp((logits - m) * inv_temp[:, None])
    c = mx.cumsum(p, axis=-1)
    sampled = mx.sum(c <= (u * c[:, -1])[:, None], axis=-1)
    sampled = mx.minimum(sampled, logits.shape[-1] - 1)
    tok = mx.where(inv_temp > 0, sampled, greedy).astype(mx.int32)
    logz = mx.logsumexp(logits, axis=-1)
    lp = mx.take_along_axis(logits, tok[:, None], axis=-1)[:, 0] - logz
    return tok, step_entropy(logits), step_gap(logits), lp


def uniforms(key: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """(next key, n uniforms in [0, 1)) from a seeded key chain."""
    key, sub = mx.random.split(key)
    return key, mx.random.uniform(shape=(n,), key=sub)
