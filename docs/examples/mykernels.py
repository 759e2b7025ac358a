"""A kernel with a bug, for the walkthrough in docs/vet.md ("Investigating a failure"): elu + 1
linear attention whose normaliser skips the last key. scripts/doc_blocks.py runs vet on it."""

import torch.nn.functional as F


def attn(q, k, v):
    q, k = F.elu(q) + 1, F.elu(k) + 1
    numerator = q @ (k.transpose(-2, -1) @ v)
    denominator = q @ k[..., :-1, :].sum(-2).unsqueeze(-1)  # the bug: the last key left out
    return numerator / denominator
