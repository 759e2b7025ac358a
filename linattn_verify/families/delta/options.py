"""The delta rule's options in the claim's grammar (Family.options): the command line's
--delta-rule, --qk-l2norm and --value-heads, pytest's and assert_linear_attention's
keywords of the same names (specs.Spec's fields)."""

from __future__ import annotations

from ...grammar import Option
from ...specs import QK_L2NORM_EPS

OPTIONS = (
    Option("delta_rule", "--delta-rule", bool, False,
           "the state follows the delta rule (DeltaNet; with --decay gates Gated DeltaNet, "
           "with --decay channel-gates KDA): fn(q, k, v, beta=(B, H, N)[, g=...]), S_t = (I - "
           "beta_t k_t k_t^T) diag(exp(g_t)) S_(t-1) + beta_t k_t v_t^T, o_t = C S_t^T q_t; "
           "with --causal --feature-map identity --no-normalize"),
    Option("qk_l2norm", "--qk-l2norm", bool, False,
           f"with --delta-rule: fn normalises q and k itself, x / sqrt(|x|^2 + "
           f"{QK_L2NORM_EPS:g}) (fla's use_qk_l2norm_in_kernel); without it k is used as given"),
    Option("value_heads", "--value-heads", int, 1,
           "with --delta-rule: fn also takes G times as many value heads as query and key "
           "heads (fla's grouped value heads, HV = G H): v, beta, g and the output of HV "
           "heads, head hv reading q and k of head hv // G; every other check calls it with "
           "HV = H (default 1: not declared)", metavar="G"),
)  # fmt: skip
