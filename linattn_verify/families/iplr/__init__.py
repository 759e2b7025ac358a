"""The identity-plus-low-rank (IPLR) rule, fla's generalised delta rule (family.IPLR_SOURCE):
S_t = (I + b_t a_t^T) S_(t-1) + k_t v_t^T, o_t = c S_t^T q_t.

reference.py: mpmath and arb; bound.py: the normwise a-priori model; golden.py: the
recurrence that sets the budget; forms.py: the built-in recurrent and chunked forms;
inputs.py: a and b, their validation and draws; family.py: all of it behind
families.protocol.Family.
"""
