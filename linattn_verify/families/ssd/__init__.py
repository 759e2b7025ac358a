"""Mamba-2's SSD layer (family.SSD_SOURCE): per head h, with dt_t = softplus(dt_t' + dt_bias_h),
h_t = exp(dt_t A_h) h_(t-1) + dt_t B_t x_t^T, y_t = (C_t^T h_t + D_h x_t) * silu(z_t).

reference.py: mpmath and arb; bound.py: the componentwise a-priori model; golden.py: the
recurrence that sets the budget; forms.py: the built-in recurrent and chunked forms;
inputs.py: dt, A, D, dt_bias and z, their validation and draws; family.py: all of it behind
families.protocol.Family.
"""
