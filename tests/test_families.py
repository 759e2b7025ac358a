"""The registry and the dispatch (linattn_verify/families): every spec goes to the family
whose folder or hooks compute it, a family chosen by name takes only its own specs, a call's
arguments are checked against its family, and the engines of the families without a folder
refuse a spec that is another family's instead of computing something else."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import torch

from linattn_verify import attention, families
from linattn_verify.families import FAMILIES, Family, family_of
from linattn_verify.families.kernelised.forms import forms_of
from linattn_verify.families.kernelised.golden import golden_attention
from linattn_verify.families.registry import NAMED
from linattn_verify.inputs import validate
from linattn_verify.specs import RSQRT_D, Spec, SpecError

DELTA = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, delta_rule=True)
ROUTES = [
    (Spec("elu"), "kernelised"),
    (Spec("taylor", causal=True, scale=RSQRT_D), "kernelised"),
    (Spec("softmax", causal=True), "softmax"),
    (Spec("identity", causal=True, decay="constant"), "scalar decay and gates"),
    (Spec("relu", causal=True, decay="gates"), "scalar decay and gates"),
    (Spec("identity", causal=True, normalize=False, decay="channel-gates"), "channel gates"),
    (DELTA, "delta rule"),
    (dataclasses.replace(DELTA, decay="channel-gates", qk_l2norm=True), "delta rule"),
]


@pytest.mark.parametrize(("spec", "name"), ROUTES, ids=[str(s) for s, _ in ROUTES])
def test_every_spec_goes_to_its_family(spec: Spec, name: str) -> None:
    assert family_of(spec).name == name


def test_every_family_answers_every_hook_the_protocol_requires() -> None:
    """Each hook without a default is a callable of every family (a family cannot land with
    one missing: the dataclass refuses it, and a None where a callable belongs fails here)."""
    hooks = [
        f.name
        for f in dataclasses.fields(Family)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    assert len(hooks) > 20
    for family in FAMILIES:
        plain = {"name", "folder", "source", "arguments", "kinds", "stepwise", "sums_memory"}
        assert [h for h in hooks if h not in plain and not callable(getattr(family, h))] == []
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_a_family_chosen_by_name_takes_only_the_specs_it_names() -> None:
    for name, family in NAMED.items():
        assert family.named and family.folder == name
    with pytest.raises(SpecError, match="unknown family 'nope'"):
        family_of(Spec("identity", causal=True, normalize=False, family="nope"))
    with pytest.raises(SpecError, match="is for the delta rule, not for the family 'iplr'"):
        Spec("identity", causal=True, normalize=False, delta_rule=True, family="iplr")


def test_any_import_of_a_spec_or_a_case_has_the_families_rules() -> None:
    """Spec and Case, imported alone in a fresh interpreter, refuse what a family refuses
    (decayed: a causal spec) and admit a family's own kind (the delta rule's)."""
    code = (
        "from linattn_verify.specs import Spec, SpecError\n"
        "from linattn_verify.cases import Case\n"
        "Case(1, 1, 2, 2, 2, 'float32', kind='long-keys')\n"
        "try:\n    Spec('elu', decay='gates')\nexcept SpecError as err:\n    print(err)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "a decay needs a causal spec (w_ij is defined for j <= i)"


def test_a_family_option_is_refused_by_every_other_family() -> None:
    """Each family's options (Family.options), set on a spec of another family, name their
    owner (each owner, for one two families take): the registry's one rule, not each
    family's check (a family's first option, which makes a spec the family's, on a family
    chosen by name)."""
    named = Spec("identity", causal=True, normalize=False, family="iplr")
    owned = [(owner, option) for owner in FAMILIES for option in owner.options]
    assert owned
    for owner, option in owned:
        if option.type is bool:
            value = not option.default
        elif option.choices:  # a choice (the delta rule's stored)
            value = option.choices[0]
        else:  # a count (value_heads) or a limit (the SSD layer's dt_min, dt_max: inf)
            value = option.default + 1 if math.isfinite(option.default) else 1.0
        for spec in (named,) + (Spec("elu"),) * (option is not owner.options[0]):
            with pytest.raises(SpecError, match=f"is for (.* or )?the {owner.name}"):
                dataclasses.replace(spec, **{option.name: value})


def test_the_shared_checks_refuse_a_decayed_spec_without_its_family() -> None:
    """inputs.validate and kernelised's golden form, called without the decay's check (its
    family's), refuse a decayed spec instead of computing attention without its decay."""
    q = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    spec = Spec("identity", causal=True, decay="gates")
    for call in (lambda: validate(q, q, q, spec), lambda: golden_attention(q, q, q, spec)):
        with pytest.raises(SpecError, match="its decay is checked by its family"):
            call()


def test_a_call_takes_its_family_arguments_only() -> None:
    q = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    with pytest.raises(SpecError, match=r"not beta \(an argument of: delta rule\)"):
        attention(q, q, q, "elu", True, beta=q[..., 0])
    with pytest.raises(SpecError, match="not gamma"):
        attention(q, q, q, "identity", True, normalize=False, delta_rule=True, gamma=q[0, :, 0, 0])
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalise'"):
        attention(q, q, q, "elu", True, normalise=False)
    assert families.arguments(Spec("elu", causal=True, decay="gates"), g=None, gamma=None) == {
        "gamma": None,
        "g": None,
    }


def test_the_engines_of_sums_refuse_another_familys_spec() -> None:
    """A delta-rule spec handed to the forms and golden form of the families without a
    folder is refused, not computed as identity attention."""
    q = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    for call in (lambda: forms_of(DELTA), lambda: golden_attention(q, q, q, DELTA)):
        with pytest.raises(SpecError, match="its family's"):
            call()
    assert families.forms_of(DELTA) == ("recurrent", "chunked")


def test_a_spec_object_in_place_of_its_fields() -> None:
    """reference, attention, attention_with_state and attention_varlen take `spec=`: the same
    numbers as its fields given as keywords, and a refusal when both are given."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    g = -torch.rand(1, 2, 6, generator=gen, dtype=torch.float64)
    spec = Spec("elu", causal=True, normalize=False, decay="gates")
    fields = {"causal": True, "normalize": False, "decay": "gates", "g": g}
    assert (
        families.reference(q, k, v, spec=spec, g=g) == families.reference(q, k, v, **fields)
    ).all()
    assert torch.equal(attention(q, k, v, spec=spec, g=g), attention(q, k, v, **fields))
    by_spec = families.attention_with_state(q, k, v, spec=spec, g=g)[0]
    causal = {name: value for name, value in fields.items() if name != "causal"}
    assert torch.equal(by_spec, families.attention_with_state(q, k, v, **causal)[0])
    cu = torch.tensor([0, 2, 6])
    packed = families.attention_varlen(q[:1], k[:1], v[:1], cu, spec=spec, g=g[:1])
    assert torch.equal(
        packed, families.attention_varlen(q[:1], k[:1], v[:1], cu, **fields | {"g": g[:1]})
    )
    with pytest.raises(TypeError, match="not both: normalize"):
        attention(q, k, v, spec=spec, normalize=False, g=g)
    with pytest.raises(TypeError, match=r"must be a linattn_verify\.Spec"):
        families.reference(q, k, v, spec="elu")
    with pytest.raises(SpecError, match="causal spec"):
        families.attention_with_state(q, k, v, spec=Spec("elu"))
