"""The delta rule (families/delta/fields.py: DeltaNet, Yang et al. 2024; Gated DeltaNet with a
scalar gate g (B, H, N), Yang, Kautz, Hatamizadeh 2025; KDA with a gate per key channel g
(B, H, N, d), Kimi Linear 2025): correct kernels written two ways and broken ones of the
classes of the public reports. The contract: fn(q, k, v, beta=(B, H, N)[, g=...][,
initial_state=S (B, H, d, dv)]), per batch and head, scale 1,

    S <- D_t S,  u_t = beta_t (v_t - S^T k_t),  S <- S + k_t u_t^T,  o_t = S^T q_t,

D_t = exp(g_t), diag(exp(g_t)) per key channel, or the identity without a decay. The chunked
kernels use the WY representation (DeltaNet, sec. 3.1; Gated DeltaNet, sec. 3.3): per chunk
of CHUNK tokens, with G the chunk's inclusive prefix sums of the gates (0 without) and
E_ij = exp(G_i - G_j) for j <= i (0 above the diagonal),

    T = (I + tril(diag(beta) (K K^T . E), -1))^-1 diag(beta)    (the UT transform),
    W = T (exp(G) . K),  U = T V,  U <- U - W S,
    O = (exp(G) . Q) S + tril(Q K^T . E) U,   S <- exp(G_C) S + (exp(G_C - G) . K)^T U,

T by forward substitution, row by row. float16, bfloat16 and float32 inputs are computed in
float32, float64 in float64, the output (and the final state) cast back once; vectorised
over batch and heads."""

from __future__ import annotations

import torch

from . import Entry
from .broken import _widen

CHUNK = 16  # tokens per chunk of the chunked kernels


def _state(qc, vc, initial_state):
    """The state entering the first token: initial_state in the compute dtype, or zeros."""
    if initial_state is not None:
        return initial_state.to(qc)
    return qc.new_zeros(*qc.shape[:2], qc.shape[-1], vc.shape[-1])


def _recurrent(q, k, v, beta, g=None, initial_state=None, flaw: str | None = None):
    """(out, final S) token by token; g None, (B, H, N) or (B, H, N, d). Keys and queries
    as columns (B, H, d, 1), values as rows (B, H, 1, dv), split into tokens once: a few
    elementwise ops a token (vet counts every op of its scaling runs). flaw: one of the
    broken variants (see ENTRIES)."""
    qc, kc, vc, bc = _widen(q, k, v, beta)
    s = _state(qc, vc, initial_state)
    n = qc.shape[2]
    if g is None:
        decays = (None,) * n
    else:
        decay = torch.exp(g.to(qc.dtype))
        decays = (decay[..., None, None] if g.dim() == 3 else decay[..., None]).unbind(2)
    tokens = zip(qc[..., None].unbind(2), kc[..., None].unbind(2),
                 vc[..., None, :].unbind(2), bc[..., None, None].unbind(2), decays)  # fmt: skip
    outs = []
    for qt, kt, vt, bt, dt in tokens:
        before = s
        if dt is not None and flaw != "gate-after":
            s = dt * s
        read = (kt * s).sum(-2, keepdim=True)  # k_t^T S, (B, H, 1, dv)
        u = bt * vt - read if flaw == "beta-one-term" else bt * (vt - read)
        s = torch.addcmul(s, kt, u)  # S + k_t u_t^T
        if flaw == "gate-after":
            s = dt * s
        outs.append((qt * (before if flaw == "read-before-update" else s)).sum(-2))
    return torch.stack(outs, dim=2).to(q.dtype), s.to(q.dtype)


def _lower(size: int, device, strict: bool = False):
    """The (size, size) boolean mask of j <= i (j < i if strict), from a comparison: tril
    itself took milliseconds a call on (B, H, 16, 16) tensors with two torch threads on a
    busy two-core machine."""
    i = torch.arange(size, device=device)
    return i[:, None] > i if strict else i[:, None] >= i


def _ut_transform(ki, bi, ratios=None, diagonal: bool = False):
    """T = (I + A)^-1 diag(beta), A = tril(diag(beta) (K K^T . E), -1) (E: ratios, None for
    all ones), by forward substitution, row by row in place: T_i = beta_i e_i - sum_(j < i)
    A_ij T_j (row i of A is 0 from column i on, so the sum runs over all of T). diagonal: the
    mask keeps the diagonal (tril(., 0)), so row i is also divided by 1 + A_ii."""
    gram = ki @ ki.mT
    if ratios is not None:
        gram = gram * ratios
    a = bi[..., :, None] * gram
    pivots = 1 + a.diagonal(dim1=-2, dim2=-1)
    t = torch.diag_embed(bi)
    below = a.masked_fill(~_lower(a.shape[-1], a.device, strict=True), 0)
    rows, columns = t.unbind(2), below[..., None].unbind(2)  # (B, H, C), (B, H, C, 1)
    for i, (row, column) in enumerate(zip(rows, columns, strict=True)):
        if i:
            row.sub_((column * t).sum(-2))
        if diagonal:
            row.div_(pivots[..., i, None])
    return t


def _wy_chunked(q, k, v, beta, initial_state=None, flaw: str | None = None):
    """(out, final S) of DeltaNet (no decay) in chunks of CHUNK tokens in the WY form (module
    docstring), from initial_state. flaw: one of the broken variants (see ENTRIES)."""
    qc, kc, vc, bc = _widen(q, k, v, beta)
    n = qc.shape[2]
    s = _state(qc, vc, initial_state)
    outs = []
    for a in range(0, n, CHUNK):
        tokens = slice(a, a + CHUNK)
        qi, ki, vi, bi = (x[:, :, tokens] for x in (qc, kc, vc, bc))
        t = _ut_transform(ki, bi, diagonal=flaw == "wy-diagonal")
        u = t @ vi - (t @ ki) @ s
        scores = (qi @ ki.mT).masked_fill(~_lower(qi.shape[2], qi.device), 0)
        outs.append(qi @ s + scores @ u)
        if flaw == "last-token-state" and a + CHUNK >= n:  # the last token's update lost
            ki, u = ki[:, :, :-1], u[:, :, :-1]
        s = s + ki.mT @ u
    return torch.cat(outs, dim=2).to(q.dtype), s.to(q.dtype)


def _gated_chunked(q, k, v, beta, g, flaw: str | None = None):
    """(out, final S) of Gated DeltaNet (scalar gates g (B, H, N)) in chunks of CHUNK tokens
    in the WY form (module docstring), the chunk's prefix sums in float32 (float64 for
    float64) log space, E formed from differences j <= i only (every factor <= 1). flaw:
    one of the broken variants (see ENTRIES)."""
    qc, kc, vc, bc = _widen(q, k, v, beta)
    prefix_dtype = g.dtype if flaw == "prefix-in-input-dtype" else qc.dtype
    gp = g.to(prefix_dtype)
    n = qc.shape[2]
    s = _state(qc, vc, None)
    outs = []
    for a in range(0, n, CHUNK):
        tokens = slice(a, a + CHUNK)
        qi, ki, vi, bi = (x[:, :, tokens] for x in (qc, kc, vc, bc))
        prefix = torch.cumsum(gp[:, :, tokens], dim=2)
        inner = prefix - gp[:, :, tokens] if flaw == "exclusive" else prefix
        prefix, inner = prefix.to(qc.dtype), inner.to(qc.dtype)
        size = qi.shape[2]
        keep = _lower(size, qc.device)
        diff = inner[..., :, None] - inner[..., None, :]
        ratios = torch.exp(diff.masked_fill(~keep, float("-inf")))  # E_ij, 0 for j > i
        t = _ut_transform(ki, bi, ratios)
        w = t @ (torch.exp(prefix)[..., None] * ki)
        u = t @ vi - w @ s
        outs.append((torch.exp(prefix)[..., None] * qi) @ s + ((qi @ ki.mT) * ratios) @ u)
        last = prefix[:, :, -1:]
        s = torch.exp(last)[..., None] * s + (torch.exp(last - prefix)[..., None] * ki).mT @ u
    return torch.cat(outs, dim=2).to(q.dtype), s.to(q.dtype)


def delta_recurrent(q, k, v, beta):
    """DeltaNet token by token."""
    return _recurrent(q, k, v, beta)[0]


def delta_wy_chunked(q, k, v, beta, initial_state=None):
    """(out, S): DeltaNet in chunks of 16, the UT transform by forward substitution,
    continuing initial_state."""
    return _wy_chunked(q, k, v, beta, initial_state)


def gated_delta_chunked(q, k, v, beta, g):
    """Gated DeltaNet in chunks of 16, the decays from the chunk's prefix sums in log
    space."""
    return _gated_chunked(q, k, v, beta, g)[0]


def kda_recurrent(q, k, v, beta, g, initial_state=None):
    """(out, S): KDA (a gate per key channel) token by token, continuing initial_state."""
    return _recurrent(q, k, v, beta, g, initial_state)


def delta_beta_one_term(q, k, v, beta):
    """BUG: beta applied to the value only, u_t = beta_t v_t - S^T k_t: the old value's
    erasure is not scaled by beta (the update is not (I - beta k k^T) S + beta k v^T)."""
    return _recurrent(q, k, v, beta, flaw="beta-one-term")[0]


def delta_wy_diagonal(q, k, v, beta):
    """BUG: the UT transform's mask keeps the diagonal, tril(diag(beta) K K^T, 0): T =
    (I + A)^-1 diag(beta) with I + A's diagonal 1 + beta_i |k_i|^2, so every row of T, W
    and U is too small (the strict lower triangle is what the WY form needs)."""
    return _wy_chunked(q, k, v, beta, flaw="wy-diagonal")[0]


def delta_last_token_state(q, k, v, beta, initial_state=None):
    """BUG: the final state misses the last token's update (the state stored before the
    chunk's last token is added); every output is right."""
    return _wy_chunked(q, k, v, beta, initial_state, flaw="last-token-state")


def delta_read_before_update(q, k, v, beta):
    """BUG: the output read before the token's update, o_t = S_(t-1)^T q_t (the token does
    not see its own key and value)."""
    return _recurrent(q, k, v, beta, flaw="read-before-update")[0]


def kda_gate_after(q, k, v, beta, g):
    """BUG: the gate applied after the update, S <- D_t (S + k_t u_t^T) with u_t read from
    the undecayed state: the token's own k u^T decayed too, and the erasure k^T S sees a
    state one gate too strong (the order of decay and correction)."""
    return _recurrent(q, k, v, beta, g, flaw="gate-after")[0]


def gated_delta_exclusive(q, k, v, beta, g):
    """BUG: the intra-chunk decays from exclusive prefix sums (B_i = g_1 + ... + g_(i-1)),
    E_ij = exp(B_i - B_j), in the UT transform and the masked product; the state's decays
    are right."""
    return _gated_chunked(q, k, v, beta, g, flaw="exclusive")[0]


def gated_delta_prefix_in_input_dtype(q, k, v, beta, g):
    """BUG: the gates' prefix sums accumulated in the inputs' dtype (float16 or bfloat16
    cumsum), the rest in float32."""
    return _gated_chunked(q, k, v, beta, g, flaw="prefix-in-input-dtype")[0]


def _grouped_heads(q, k, v, flaw: str | None = None):
    """q and k of H heads repeated to v's G H, head hv reading hv // G (fla's grouped value
    heads); flaw "modulo": head hv reads hv % H (q.repeat), the layout of another grouping."""
    group = v.shape[1] // q.shape[1]
    if flaw == "modulo":
        return q.repeat(1, group, 1, 1), k.repeat(1, group, 1, 1)
    return q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)


def kda_grouped_value_heads(q, k, v, beta, g, initial_state=None):
    """(out, S): channel gates with grouped value heads (q and k repeated to v's heads,
    blocked), continuing initial_state of v's heads."""
    return _recurrent(*_grouped_heads(q, k, v), v, beta, g, initial_state)


def kda_grouped_modulo(q, k, v, beta, g):
    """BUG: grouped value heads read q and k of head hv % H, not hv // G (the same for G = 1
    or H = 1: only a call with more value heads than query heads, H > 1, shows it)."""
    return _recurrent(*_grouped_heads(q, k, v, "modulo"), v, beta, g)[0]


def _entry(name, fn, broken: bool, bug: str, caught_by=(), decay=None, **kw) -> Entry:
    return Entry(name, fn, "identity", True, broken, bug, caught_by=caught_by, decay=decay,
                 normalize=False, delta_rule=True, **kw)  # fmt: skip


GATES, CHANNEL = "gates", "channel-gates"
ENTRIES = (
    _entry("delta-recurrent", delta_recurrent, False, "correct: token by token"),
    _entry("delta-wy-chunked-state", delta_wy_chunked, False,
           "correct: chunks of 16, the UT transform by forward substitution, its state S",
           state="S"),
    _entry("gated-delta-chunked", gated_delta_chunked, False,
           "correct: scalar gates, chunks of 16, decays from prefix sums in log space",
           decay=GATES),
    _entry("kda-recurrent", kda_recurrent, False,
           "correct: channel gates, token by token, its state S", decay=CHANNEL, state="S"),
    _entry("delta-beta-one-term", delta_beta_one_term, True,
           "beta on the value only: u = beta v - S^T k", ("reference", "associativity")),
    _entry("delta-wy-diagonal", delta_wy_diagonal, True,
           "the UT transform's mask keeps the diagonal (T wrong)",
           ("reference", "associativity")),
    _entry("delta-last-token-state", delta_last_token_state, True,
           "the final state misses the last token's update", ("final-state",), state="S"),
    _entry("delta-read-before-update", delta_read_before_update, True,
           "the output read before the update: o_t = S_(t-1)^T q_t",
           ("reference", "associativity")),
    _entry("kda-gate-after", kda_gate_after, True,
           "the gate applied after the update, to k u^T too", ("reference", "decay"),
           decay=CHANNEL),
    _entry("gated-delta-exclusive", gated_delta_exclusive, True,
           "the intra-chunk decays from exclusive prefix sums", ("reference", "decay"),
           decay=GATES),
    _entry("gated-delta-prefix-in-input-dtype", gated_delta_prefix_in_input_dtype, True,
           "the gates' prefix sums in float16/bfloat16", ("decay",), decay=GATES),
    _entry("kda-grouped-value-heads", kda_grouped_value_heads, False,
           "correct: channel gates, two value heads per query head, its state S",
           decay=CHANNEL, value_heads=2, state="S"),
    _entry("kda-grouped-modulo", kda_grouped_modulo, True,
           "grouped value heads read query head hv % H, not hv // G", ("value-heads",),
           decay=CHANNEL, value_heads=2, smallest=True),
)  # fmt: skip
