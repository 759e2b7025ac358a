"""The specs: what each feature map computes, once, for every other layer to agree on.

Output row i of attention is sum_j sim(q_i, k_j) v_j / (eps + sum_j sim(q_i, k_j)), with
key j used by query i iff j <= i when the spec is causal (docs/contract.md, "The specs").
Unnormalised (normalize=False) it is the numerator alone; `scale` multiplies every
similarity; a decay multiplies sim(q_i, k_j) by w_ij (`decay_weight`).
"""

from __future__ import annotations

from collections.abc import Callable
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


# the decays a spec may name (Spec.decay): each its family's (families/decayed/fields.py,
# families/channel_gates/fields.py; the delta rule takes the ones given per token)
DECAYS = ("constant", "gates", "channel-gates")
RSQRT_D = "d^-0.5"  # the scale 1 / sqrt(d) of the head dimension d (fla's default)
# The families' rules over their own fields (install_family_rules)
_FAMILY_RULES: list[Callable[[Spec], object]] = []


def install_family_rules(rules: Callable[[Spec], object]) -> None:
    """Check every Spec made from now on by `rules` too: the registry's family_of, which
    raises SpecError where the spec's family rejects it (Family.check) or sets another
    family's option (Family.options). linattn_verify's own import installs it; a Spec made before
    that, inside that import, is checked for its shared fields alone."""
    _FAMILY_RULES[:] = [rules]


@dataclass(frozen=True)
class Spec:
    """What an implementation claims: a feature map, causality, a denominator eps, whether
    the output is normalised, a similarity scale, a decay (None, or one of DECAYS), the
    precision of its float32 products (None: IEEE float32; "tf32": their inputs rounded to
    TF32, as GPU tensor cores do by default), the delta rule's fields (delta_rule,
    qk_l2norm, value_heads), the SSD layer's (z_gate, dt_softplus, dt_min, dt_max) and the
    family, by its name, whose state update the other fields do not state
    (families.registry.NAMED). The fields every family reads are
    checked here; what each family admits, and the fields it owns, by its folder (its
    Family.check and Family.options, through install_family_rules)."""

    feature_map: str
    causal: bool = False
    eps: float = 0.0
    normalize: bool = True
    scale: float | str = 1.0  # a number, or RSQRT_D
    decay: str | None = None
    dot_precision: str | None = None  # "tf32": float32 products from TF32 inputs
    delta_rule: bool = False  # the state updated by the delta rule (families/delta/fields.py)
    qk_l2norm: bool = False  # with it, q and k normalised inside the kernel
    # G: it also takes HV = G H value heads, head hv reading q and k of head hv // G
    value_heads: int = 1
    family: str | None = None  # a family chosen by name (families.registry.NAMED)
    # "input-dtype": the delta rule's chunk intermediates (the UT transform, w, u, the chunk
    # states, the new values and their cotangents) stored in the inputs' dtype between
    # kernels by design (families/delta/golden.py, golden_delta_stored)
    stored: str | None = None
    # the SSD layer's (families/ssd/fields.py): its output gated by silu(z), its dt through
    # softplus, and dt clamped to [dt_min, dt_max]
    z_gate: bool = False
    dt_softplus: bool = False
    dt_min: float = 0.0
    dt_max: float = float("inf")

    def __post_init__(self) -> None:
        feature_map(self.feature_map)
        if self.family is not None and not isinstance(self.family, str):
            raise SpecError(f"a family by name is a string, not {self.family!r}")
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
        if self.decay is not None and self.decay not in DECAYS:
            raise SpecError(f"unknown decay {self.decay!r}; known: {', '.join(DECAYS)}")
        for rules in _FAMILY_RULES:
            rules(self)

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
    def defining(self) -> Spec:
        """The spec without what says how the kernel rounds or may be called, not what it
        computes (dot_precision, value_heads, stored): the key of the known-answer vectors."""
        return replace(self, dot_precision=None, value_heads=1, stored=None)

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
        words += [f"stored {self.stored}"] * (self.stored is not None)
        words += ["z-gate"] * self.z_gate + ["dt-softplus"] * self.dt_softplus
        limited = (self.dt_min, self.dt_max) != (0.0, float("inf"))
        words += [f"dt-limit=({self.dt_min:g}, {self.dt_max:g})"] * limited
        words += [f"family={self.family}"] * (self.family is not None)
        return f"{self.feature_map} ({', '.join(words)})"
