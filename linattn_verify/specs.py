"""The specs: what each feature map computes, once, for every other layer to agree on.

Output row i of attention is sum_j sim(q_i, k_j) v_j / (eps + sum_j sim(q_i, k_j)), with
key j used by query i iff j <= i when the spec is causal (docs/contract.md, "The specs").
Unnormalised (normalize=False) it is the numerator alone; `scale` multiplies every
similarity; a decay multiplies sim(q_i, k_j) by w_ij (`decay_weight`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


class SpecError(ValueError):
    """A spec or an input that does not make sense; the message names the problem."""


@dataclass(frozen=True)
class FeatureMap:
    """Static facts about one feature map.

    kernelised: sim(q, k) = phi(q) . phi(k) with a finite feature vector phi.
    positive: sim(q, k) >= 0 for every input (so outputs are convex combinations of v).
    needs_projection: a Performer map, whose phi uses a projection W of shape (m, d).
    source: where the formula comes from.
    """

    name: str
    kernelised: bool
    positive: bool
    needs_projection: bool
    source: str

    @property
    def nonnegative_features(self) -> bool:
        """phi(x) >= 0 element by element: the positive kernelised maps but taylor, whose
        kernel 1 + x + x^2 / 2 is positive while its features x_m are signed."""
        return self.kernelised and self.positive and self.name != "taylor"

    def feature_dim(self, d: int, m: int | None = None) -> int:
        """Length of phi(x) for head dimension d (and m projection rows)."""
        if not self.kernelised:
            raise SpecError(f"feature map {self.name!r} has no finite feature expansion")
        return {
            "elu": d,
            "relu": d,
            "identity": d,
            "performer-positive": m,
            "performer-hyperbolic": 2 * (m or 0),
            "performer-trig": 2 * (m or 0),
            "cosformer": 2 * d,
            "taylor": 1 + d + d * d,
        }[self.name]


FEATURE_MAPS: dict[str, FeatureMap] = {
    fm.name: fm
    for fm in (
        FeatureMap(
            "softmax",
            kernelised=False,
            positive=True,
            needs_projection=False,
            source="Vaswani et al. 2017, eq. 1: sim = exp(q.k / sqrt(d))",
        ),
        FeatureMap(
            "elu",
            kernelised=True,
            positive=True,
            needs_projection=False,
            source="Katharopoulos et al. 2020, eq. 7: phi(x) = elu(x) + 1",
        ),
        FeatureMap(
            "relu",
            kernelised=True,
            positive=True,
            needs_projection=False,
            source="phi(x) = max(x, 0); the denominator can be exactly 0",
        ),
        FeatureMap(
            "identity",
            kernelised=True,
            positive=False,
            needs_projection=False,
            source="phi(x) = x: sim = q.k (Sun et al. 2023, RetNet, eq. 5; Yang et al. 2024, "
            "GLA, eq. 1, without a feature map)",
        ),
        FeatureMap(
            "performer-positive",
            kernelised=True,
            positive=True,
            needs_projection=True,
            source="Choromanski et al. 2021 (FAVOR+), Lemma 1: "
            "phi(x) = exp(W x' - |x'|^2/2) / sqrt(m), x' = x d^(-1/4)",
        ),
        FeatureMap(
            "performer-hyperbolic",
            kernelised=True,
            positive=True,
            needs_projection=True,
            source="Choromanski et al. 2021, Lemma 1 (hyperbolic): "
            "phi(x) = exp(-|x'|^2/2) / sqrt(2m) [exp(W x'), exp(-W x')]",
        ),
        FeatureMap(
            "performer-trig",
            kernelised=True,
            positive=False,
            needs_projection=True,
            source="Choromanski et al. 2021, sec. 2.3 (trigonometric): "
            "phi(x) = exp(|x'|^2/2) / sqrt(m) [sin(W x'), cos(W x')]",
        ),
        FeatureMap(
            "cosformer",
            kernelised=True,
            positive=True,
            needs_projection=False,
            source="Qin et al. 2022, eq. 9-11: relu(q_i).relu(k_j) cos(pi (i-j) / (2M)), "
            "M = max(N_q, N_k)",
        ),
        FeatureMap(
            "taylor",
            kernelised=True,
            positive=True,
            needs_projection=False,
            source="Arora et al. 2024 (Based), sec. 3: 1 + s + s^2/2, s = q.k / sqrt(d)",
        ),
    )
}


def summing(spec: Spec, what: str) -> Spec:
    """`spec` where its output sums its similarities (Spec.sums_similarities); SpecError
    where its family states a state update of its own, whose `what` is its folder's
    (families/<name>/, reached through linattn_verify.families)."""
    if not spec.sums_similarities:
        raise SpecError(f"{spec}: its {what} are its family's (linattn_verify.families)")
    return spec


def feature_map(name: str) -> FeatureMap:
    """The feature map called `name`, or a SpecError listing the known ones."""
    try:
        return FEATURE_MAPS[name]
    except (KeyError, TypeError):
        known = ", ".join(FEATURE_MAPS)
        raise SpecError(f"unknown feature map {name!r}; known: {known}") from None


DECAYS = ("constant", "gates", "channel-gates")
# The maps whose feature m is channel m of the key (phi(k)_m depends on k_m alone), so that a
# gate per key channel is a gate per feature channel
CHANNEL_GATED_MAPS = ("identity", "elu", "relu")
# the delta rule (Spec.delta_rule) takes the decays given per token alone
DELTA_DECAYS = (None, "gates", "channel-gates")
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
RSQRT_D = "d^-0.5"  # the scale 1 / sqrt(d) of the head dimension d (fla's default)
DECAY_SOURCES = {
    "constant": "Sun et al. 2023 (RetNet), eq. 5: w_ij = gamma^(i - j), one gamma per head",
    "gates": "Yang et al. 2024 (GLA), eq. 3 with scalar gates, and Dao & Gu 2024 (Mamba2), "
    "sec. 3: w_ij = exp(g_(j+1) + ... + g_i), a log-gate g_t <= 0 per token and head",
    "channel-gates": "Yang et al. 2024 (GLA), sec. 4.1: S_t = diag(alpha_t) S_(t-1) + "
    "phi(k_t) v_t^T, alpha_t = exp(g_t), and its parallel form O = ((Q . B)(K / B)^T . M) V, "
    "B_t = alpha_1 ... alpha_t: sim_ij = sum_m phi(q_i)_m phi(k_j)_m exp(G_im - G_jm), G_i "
    "= g_0 + ... + g_i, a log-gate g_tm <= 0 per token, head and key channel",
}


@dataclass(frozen=True)
class Spec:
    """What an implementation claims: a feature map, causality, a denominator eps, whether
    the output is normalised, a similarity scale, a decay (None, or one of DECAYS), the
    precision of its float32 products (None: IEEE float32; "tf32": their inputs rounded to
    TF32, as GPU tensor cores do by default), whether its state follows the delta rule
    (causal, identity, unnormalised; DELTA_SOURCE) and whether it normalises q and k, and
    the family, by its name, whose state update the other fields do not state (the families
    the registry chooses by name: families.registry.NAMED; its own validation there)."""

    feature_map: str
    causal: bool = False
    eps: float = 0.0
    normalize: bool = True
    scale: float | str = 1.0  # a number, or RSQRT_D
    decay: str | None = None
    dot_precision: str | None = None  # "tf32": float32 products from TF32 inputs
    delta_rule: bool = False  # the state updated by the delta rule (DELTA_SOURCE)
    qk_l2norm: bool = False  # q and k normalised inside the kernel (QK_L2NORM_EPS)
    # G: it also takes HV = G H value heads, head hv reading q and k of head hv // G
    value_heads: int = 1
    family: str | None = None  # a family chosen by name (families.registry.NAMED)

    def __post_init__(self) -> None:
        feature_map(self.feature_map)
        if self.family is not None and (not isinstance(self.family, str) or self.delta_rule):
            what = "the delta rule's fields" if self.delta_rule else repr(self.family)
            raise SpecError(f"a family by name is a string, without {what}")
        if not (self.eps >= 0.0 and self.eps < float("inf")):
            raise SpecError(f"eps must be finite and >= 0, got {self.eps!r}")
        number = isinstance(self.scale, int | float) and not isinstance(self.scale, bool)
        if self.scale != RSQRT_D and not (number and 0.0 < self.scale < float("inf")):
            raise SpecError(f"scale must be finite and > 0 or {RSQRT_D!r}, got {self.scale!r}")
        kernel = self.info.kernelised
        if not self.normalize and (not kernel or self.eps):
            what = "eps (it is the denominator's)" if kernel else "softmax (no feature map)"
            raise SpecError(f"an unnormalised spec takes no {what}")
        if self.dot_precision not in (None, "tf32"):
            raise SpecError(f"dot_precision must be None or 'tf32', got {self.dot_precision!r}")
        if self.delta_rule or self.qk_l2norm or self.value_heads != 1:
            self._check_delta()
        if self.decay is None:
            return
        if self.decay not in DECAYS:
            raise SpecError(f"unknown decay {self.decay!r}; known: {', '.join(DECAYS)}")
        if not self.causal:
            raise SpecError("a decay needs a causal spec (w_ij is defined for j <= i)")
        if not kernel or self.feature_map == "cosformer":
            raise SpecError(f"{self.feature_map} takes no decay (its weights are its own)")
        if self.decay == "channel-gates" and self.feature_map not in CHANNEL_GATED_MAPS:
            raise SpecError(
                f"channel gates need a feature map whose feature m is key channel m "
                f"({', '.join(CHANNEL_GATED_MAPS)}), not {self.feature_map}"
            )

    def _check_delta(self) -> None:
        """SpecError unless the delta rule's fields fit: causal, identity features,
        unnormalised, a decay of DELTA_DECAYS; qk_l2norm and value_heads (an integer >= 1)
        only with the delta rule."""
        if not self.delta_rule:
            what = "qk_l2norm (--qk-l2norm)" if self.qk_l2norm else "value_heads (--value-heads)"
            raise SpecError(f"{what} is for the delta rule (--delta-rule)")
        if isinstance(self.value_heads, bool) or not isinstance(self.value_heads, int):
            raise SpecError(f"value_heads must be an integer >= 1, got {self.value_heads!r}")
        if self.value_heads < 1:
            raise SpecError(f"value_heads must be an integer >= 1, got {self.value_heads}")
        missing = [
            need
            for need, holds in (
                ("causal (--causal)", self.causal),
                ("identity features (--feature-map identity)", self.feature_map == "identity"),
                ("unnormalised (--no-normalize)", not self.normalize),
            )
            if not holds
        ]
        if missing:
            raise SpecError(f"the delta rule (o_t = c S_t^T q_t) needs: {', '.join(missing)}")
        if self.decay not in DELTA_DECAYS:
            raise SpecError(f"the delta rule takes gates or channel-gates, not {self.decay}")

    @property
    def info(self) -> FeatureMap:
        return FEATURE_MAPS[self.feature_map]

    @property
    def sums_similarities(self) -> bool:
        """Whether the output is the attention sum of the spec's similarities (kernelised,
        decayed or softmax: the engines of reference/ and the forms of implementations/);
        False where a family states a state update of its own (the delta rule, a family
        chosen by name), whose engines are its folder's."""
        return not self.delta_rule and self.family is None

    @property
    def plain(self) -> bool:
        """Normalised, unscaled, without a decay and with IEEE products: the specs the certified
        engine, the fast bound, the long-context check and the known-answer vectors cover."""
        plain = self.normalize and self.scale == 1.0 and self.decay is None
        return plain and self.dot_precision is None

    @property
    def gated(self) -> bool:
        """Whether the decay is given per token (log-gates g, sliced along N with q's
        tokens): gates or channel gates."""
        return self.decay in ("gates", "channel-gates")

    @property
    def per_token(self) -> bool:
        """Whether the decay argument the checks pass is given per token, sliced along N
        with q's tokens: gates, or the delta rule's beta (families/delta/inputs.py)."""
        return self.gated or self.delta_rule

    @property
    def defining(self) -> Spec:
        """The spec without what says how the kernel rounds or may be called, not what it
        computes (dot_precision, value_heads): the key of the known-answer vectors."""
        return replace(self, dot_precision=None, value_heads=1)

    def scale_for(self, d: int) -> float:
        """The similarity scale at head dimension d (rounded to float64 for RSQRT_D)."""
        return d**-0.5 if self.scale == RSQRT_D else float(self.scale)

    @property
    def ordered(self) -> str | None:
        """Why the output depends on the order of the keys (taken with their values); None
        where every permutation of them leaves it unchanged."""
        if self.causal:
            return "causal specs depend on the order of tokens"
        if self.feature_map == "cosformer":
            return "cosformer weights depend on token positions"
        return None

    @property
    def no_state(self) -> str | None:
        """Why a kernel of this spec carries no state from one piece of a sequence to the
        next (docs/contract.md, "Carried state"); None when it does."""
        if not self.causal:
            return "a non-causal spec carries no state"
        if not self.info.kernelised:
            return f"{self.feature_map} has no finite feature map: no state"
        if self.feature_map == "cosformer":
            return "cosformer's weights depend on the whole length: no state continues it"
        return None

    def __str__(self) -> str:
        words = ["causal" if self.causal else "non-causal"]
        words += [f"eps={self.eps:g}"] * bool(self.eps)
        words += ["unnormalised"] * (not self.normalize)
        words += [f"scale={self.scale:g}" if self.scale != RSQRT_D else f"scale={RSQRT_D}"] * (
            self.scale != 1.0
        )
        words += [f"decay={self.decay}"] * (self.decay is not None)
        words += [f"{self.dot_precision} products"] * (self.dot_precision is not None)
        words += ["delta rule"] * self.delta_rule + ["qk-l2norm"] * self.qk_l2norm
        words += [f"value-heads={self.value_heads}"] * (self.value_heads != 1)
        words += [f"family={self.family}"] * (self.family is not None)
        return f"{self.feature_map} ({', '.join(words)})"
