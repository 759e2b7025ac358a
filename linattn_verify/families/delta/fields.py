"""The delta rule's spec fields: their source, their options in the claim's grammar
(Family.options: the command line's --delta-rule, --qk-l2norm and --value-heads, pytest's
and assert_linear_attention's keywords of the same names, specs.Spec's fields) and their
rules (Family.check)."""

from __future__ import annotations

from ...grammar import Option
from ...specs import Spec, SpecError

DELTA_SOURCE = (
    "Yang, Wang, Zhang, Shen, Kim 2024 (DeltaNet, 'Parallelizing Linear Transformers with the "
    "Delta Rule over Sequence Length'), eq. 1-2: S_t = (I - beta_t k_t k_t^T) S_(t-1) + beta_t "
    "k_t v_t^T, o_t = c S_t^T q_t; with gates (Yang, Kautz, Hatamizadeh 2025, Gated DeltaNet, "
    "eq. 10) S_(t-1) first times alpha_t = exp(g_t), with channel gates (Kimi Linear 2025, KDA, "
    "eq. 1) times diag(exp(g_t))"
)
# qk_l2norm: q and k normalised inside the kernel, x / sqrt(|x|^2 + eps), with fla's eps
# (fla/modules/l2norm.py, use_qk_l2norm_in_kernel)
QK_L2NORM_EPS = 1e-6
# Spec.stored: what a chunk kernel may store in the inputs' dtype between its kernels by
# design (fla's chunk_delta_rule, chunk_gated_delta_rule, chunk_kda: golden.py)
STORED = ("input-dtype",)
# the delta rule takes the decays given per token alone
DELTA_DECAYS = (None, "gates", "channel-gates")

VALUE_HEADS = Option(  # shared with the SSD layer (families/ssd/fields.py)
    "value_heads", "--value-heads", int, 1,
    "with --delta-rule or --family ssd: fn also takes G times as many value heads as "
    "query and key heads (fla's grouped value heads, HV = G H; the SSD layer's C and B "
    "shared by groups of G heads, mamba_ssm's ngroups = HV / G): v, its per-token "
    "arguments and the output of HV heads, head hv reading q and k of head hv // G; "
    "every other check calls it with HV = H (default 1: not declared)", metavar="G")  # fmt: skip

OPTIONS = (
    Option("delta_rule", "--delta-rule", bool, False,
           "the state follows the delta rule (DeltaNet; with --decay gates Gated DeltaNet, "
           "with --decay channel-gates KDA): fn(q, k, v, beta=(B, H, N)[, g=...]), S_t = (I - "
           "beta_t k_t k_t^T) diag(exp(g_t)) S_(t-1) + beta_t k_t v_t^T, o_t = C S_t^T q_t; "
           "with --causal --feature-map identity --no-normalize"),
    Option("qk_l2norm", "--qk-l2norm", bool, False,
           f"with --delta-rule: fn normalises q and k itself, x / sqrt(|x|^2 + "
           f"{QK_L2NORM_EPS:g}) (fla's use_qk_l2norm_in_kernel); without it k is used as given"),
    VALUE_HEADS,
    Option("stored", "--stored", str | None, None,
           "with --delta-rule: its chunk kernels store their intermediates (the UT transform, "
           "w, u, the chunk states, the new values, and their cotangents) in the inputs' dtype "
           "by design, as fla's chunk kernels do: 16-bit outputs and gradients are budgeted "
           "by a chunked golden that rounds those (docs/delta-rule.md)",
           choices=STORED),
)  # fmt: skip


def check(spec: Spec) -> None:
    """SpecError unless the delta rule's spec fits: causal, identity features, unnormalised,
    a decay of DELTA_DECAYS, value_heads an integer >= 1."""
    check_value_heads(spec)
    missing = [
        need
        for need, holds in (
            ("causal (--causal)", spec.causal),
            ("identity features (--feature-map identity)", spec.feature_map == "identity"),
            ("unnormalised (--no-normalize)", not spec.normalize),
        )
        if not holds
    ]
    if missing:
        raise SpecError(f"the delta rule (o_t = c S_t^T q_t) needs: {', '.join(missing)}")
    if spec.stored not in (None, *STORED):
        raise SpecError(f"stored must be None or one of {', '.join(STORED)}, got {spec.stored!r}")
    if spec.decay not in DELTA_DECAYS:
        raise SpecError(f"the delta rule takes gates or channel-gates, not {spec.decay}")


def check_value_heads(spec: Spec) -> None:
    """SpecError unless value_heads (VALUE_HEADS, the delta rule's and the SSD layer's) is an
    integer >= 1."""
    heads = spec.value_heads
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise SpecError(f"value_heads must be an integer >= 1, got {heads!r}")
