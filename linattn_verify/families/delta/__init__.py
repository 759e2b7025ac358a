"""The delta rule (DeltaNet; Gated DeltaNet with scalar gates; KDA with channel gates),
families/delta/fields.py: S_t = alpha_t (I - beta_t k_t k_t^T) S_(t-1) + beta_t k_t v_t^T,
o_t = c S_t^T q_t.

reference.py: mpmath, arb and the certified float64 recurrence; gradients.py and
certified_gradients.py: exact and certified gradients; bound.py and gradient_bound.py: the
normwise a-priori models; golden.py: the recurrence that sets the budget; forms.py: the
built-in recurrent and chunked forms; family.py: all of it behind families.protocol.Family.
"""
