"""Known-answer vectors (linattn_verify/known_answers/: the code and the vectors): reproducible
bytes, hashes that catch a changed byte, outputs that agree with a fresh exact computation,
and the report of an implementation's error per vector."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify import known_answers
from linattn_verify.cases import Case
from linattn_verify.cli import main
from linattn_verify.under_test import resolve

ROOT = Path(__file__).resolve().parents[1]
KNOWN_ANSWERS = ROOT / "linattn_verify" / "known_answers"  # the checkout's vectors
SMALL = ("-n1-float32", "-float64", "-extreme-float16")


def _small(name: str) -> bool:
    maps = ("elu-", "softmax-", "performer-trig-", "identity-causal-unnormalised-scaled-delta-")
    return name.startswith(maps) and name.endswith(SMALL)


def test_build_is_byte_for_byte_reproducible_and_matches_the_committed_vectors(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    known_answers.build(first, only=_small)
    known_answers.build(second, only=_small)
    files = sorted(p.name for p in (first / "vectors").iterdir())
    assert len(files) == 34  # elu's channel gates and eps 1e-6, the delta rule's among them
    for name in files:
        data = (first / "vectors" / name).read_bytes()
        assert data == (second / "vectors" / name).read_bytes(), name
        assert data == (KNOWN_ANSWERS / "vectors" / name).read_bytes(), f"committed {name} differs"


def test_every_stored_input_is_what_the_generator_draws():
    """The committed vectors' inputs are the generator's (a drawing changed without a
    rebuild leaves vectors whose hashes and outputs still agree with themselves)."""
    for name, spec, case in known_answers.all_vectors():
        stored = json.loads((KNOWN_ANSWERS / "vectors" / f"{name}.json").read_text())["inputs"]
        assert stored == known_answers.vector_inputs(spec, case)[1], f"{name}: rebuild the vectors"


def test_committed_vectors_pass_the_check():
    """What CI runs: every hash, and a sample recomputed with the arb engine."""
    assert known_answers.check(KNOWN_ANSWERS, sample=6) == []


def test_the_manifest_lists_the_vectors_in_the_generators_order():
    """The families' parts (Family.known_answer_specs) keep the order the vectors were
    published in: the committed manifest's, entry by entry."""
    manifest = known_answers.load_manifest(KNOWN_ANSWERS)
    names = [name for name, _, _ in known_answers.all_vectors()]
    assert [e["name"] for e in manifest["vectors"]] == names


def test_every_spec_has_causal_and_full_vectors_and_the_folder_is_small():
    manifest = known_answers.load_manifest(KNOWN_ANSWERS)
    maps = {s.feature_map for s in known_answers.KAT_SPECS if s.plain and s.eps == 0}
    assert len(maps) == 8  # every map but identity
    for name in maps:
        for causal in (False, True):
            assert any(
                e["feature_map"] == name and e["causal"] == causal for e in manifest["vectors"]
            )
    size = sum(p.stat().st_size for p in KNOWN_ANSWERS.rglob("*") if p.is_file())
    assert size <= 20 * 2**20


def test_one_changed_byte_fails_the_check_naming_the_file(tmp_path):
    copy = tmp_path / "known_answers"
    shutil.copytree(KNOWN_ANSWERS, copy)
    victim = copy / "vectors" / "elu-causal-float16.json"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    problems = known_answers.check(copy, sample=0)
    assert len(problems) == 1 and "elu-causal-float16.json" in problems[0]
    run = subprocess.run(
        [sys.executable, "-m", "linattn_verify", "known-answers", "check", "--dir", str(copy)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 1 and "elu-causal-float16.json" in run.stdout


def test_references_is_a_deprecated_alias_that_help_does_not_list(capsys):
    """`references`, the command's former name, still runs `known-answers` (users' scripts
    call it) after one line on stderr naming the new name; --help lists known-answers alone."""
    count = len(known_answers.load_manifest(KNOWN_ANSWERS)["vectors"])
    argv = ["check", "--dir", str(KNOWN_ANSWERS), "--sample", "0", "--quiet"]
    assert main(["known-answers", *argv]) == 0
    current = capsys.readouterr()
    assert main(["references", *argv]) == 0
    former = capsys.readouterr()
    assert former.out == current.out and f"{count} vectors: ok" in former.out
    assert current.err == "" and len(former.err.splitlines()) == 1, former.err
    assert "known-answers" in former.err
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert re.search(r"^ +known-answers ", listed, re.M), listed
    assert not re.search(r"^ +references\b", listed, re.M), listed


def test_a_wrong_stored_output_is_found_by_recomputation(tmp_path):
    copy = tmp_path / "known_answers"
    shutil.copytree(KNOWN_ANSWERS, copy)
    manifest = known_answers.load_manifest(copy)
    entry = next(e for e in manifest["vectors"] if e["name"] == "elu-full-n1-float32")
    path = copy / entry["file"]
    vector = json.loads(path.read_text())
    vector["output"]["values"][0] = "0.5"  # and a consistent hash, as a careless rebuild would
    path.write_text(json.dumps(vector))
    data = path.read_bytes()
    entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    problems = known_answers.check(copy, only=lambda name: name.startswith("elu-full-n"))
    assert len(problems) == 1 and problems[0].startswith(f"{path}: output 0 is 0.5")


def test_edits_to_the_manifest_itself_fail_the_check(tmp_path):
    copy = tmp_path / "known_answers"
    shutil.copytree(KNOWN_ANSWERS, copy)
    original = (copy / "manifest.json").read_text()
    manifest = json.loads(original)
    manifest["vectors"][3]["causal"] = not manifest["vectors"][3]["causal"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any("manifest entry does not match" in p for p in known_answers.check(copy, sample=0))
    manifest = json.loads(original)  # a vector and its entry both gone
    gone = manifest["vectors"].pop(5)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / gone["file"]).unlink()
    problems = known_answers.check(copy, sample=0)
    assert any("does not list the generator's vectors" in p and gone["name"] in p for p in problems)


def test_decoded_inputs_are_the_exact_values_they_were_built_from():
    vector = json.loads((KNOWN_ANSWERS / "vectors" / "elu-full-bfloat16.json").read_text())
    q = known_answers.decode(vector["inputs"]["q"])
    assert q.dtype == torch.bfloat16 and torch.equal(q, Case(**vector["case"]).tensors()[0])


def test_run_reports_errors_in_roundoff_units():
    chunked = resolve(form="chunked", feature_map="elu", causal=True)
    rows = known_answers.run_vectors(chunked, directory=KNOWN_ANSWERS)
    assert len(rows) == 10 and all(r["max_error_units"] < 10 for r in rows)

    def sees_every_key(q, k, v):  # a causal claim with the non-causal computation
        return lv.attention(q, k, v, "elu", causal=False)

    bad = known_answers.run_vectors(
        resolve(sees_every_key, feature_map="elu", causal=True), KNOWN_ANSWERS
    )
    assert max(r["max_error_units"] for r in bad) > 1e3
    assert np.isfinite([r["max_error_units"] for r in rows]).all()


def test_channel_gated_vectors_judge_gla_kernels():
    """The channel-gated vectors (gates next to 1, next to 0, of about e^-1 a token among
    them) pass the zoo's chunked GLA kernel within their bound and fail one whose chunk
    prefix sums are exclusive; a decayed spec without vectors is named."""
    from tests.zoo import gla

    claim = {"feature_map": "identity", "causal": True, "normalize": False}
    claim["decay"] = "channel-gates"
    assert (
        known_answers.not_applicable(resolve(gla.gla_chunked, **claim).spec) is not None
    )  # scale 1
    claim["scale"] = "d^-0.5"

    def scaled(fn):
        return lambda q, k, v, g: fn(q * q.shape[-1] ** -0.5, k, v, g)

    chunked = scaled(lambda q, k, v, g: gla.gla_chunked(q, k, v, g)[0])
    rows = known_answers.run_vectors(resolve(chunked, **claim), KNOWN_ANSWERS)
    assert len(rows) == 10 and all(r["outside_bound"] == 0 for r in rows), rows
    bad = known_answers.run_vectors(resolve(scaled(gla.gla_exclusive), **claim), KNOWN_ANSWERS)
    assert sum(r["outside_bound"] for r in bad) > 0


def test_run_reports_a_broken_contract_instead_of_judging_it():
    def in_float16(q, k, v):  # a cheaper dtype must not buy a coarser unit
        return lv.attention(q.half(), k.half(), v.half(), "elu")

    rows = known_answers.run_vectors(resolve(in_float16, feature_map="elu"), KNOWN_ANSWERS)
    float32 = [r for r in rows if r["dtype"] == "float32"]
    assert float32 and all("expected" in r["problem"] for r in float32)


def test_run_needs_vectors_for_the_spec(tmp_path):
    with pytest.raises(lv.SpecError):
        known_answers.run_vectors(resolve(lambda q, k, v: v, feature_map="elu"), tmp_path / "none")


DELTA_CLAIM = {
    "feature_map": "identity",
    "causal": True,
    "normalize": False,
    "scale": "d^-0.5",
    "delta_rule": True,
}


def _is_delta(name: str) -> bool:
    return "-delta-" in name


def test_delta_rule_vectors_agree_with_a_fresh_exact_computation():
    """Each delta-rule spec's vectors (DeltaNet, Gated DeltaNet, KDA, DeltaNet with q and k
    normalised inside) store beta, and g where gated, and their digits are the arb
    recurrence's."""
    manifest = known_answers.load_manifest(KNOWN_ANSWERS)
    delta = [e for e in manifest["vectors"] if _is_delta(e["name"])]
    for spec in (s for s in known_answers.KAT_SPECS if s.delta_rule):
        fields = (spec.decay, spec.qk_l2norm)
        assert sum((e["decay"], e["qk_l2norm"]) == fields for e in delta) >= 8, spec
    name = "identity-causal-unnormalised-scaled-delta-channel-gates-float16.json"
    gated = json.loads((KNOWN_ANSWERS / "vectors" / name).read_text())
    assert gated["inputs"]["g"]["shape"] == [1, 2, 16, 4] and gated["spec"]["delta_rule"]
    assert gated["inputs"]["beta"]["shape"] == [1, 2, 16]
    assert known_answers.check(KNOWN_ANSWERS, only=_is_delta) == []


def test_a_changed_digit_of_a_delta_rule_vector_is_found(tmp_path):
    copy = tmp_path / "known_answers"
    shutil.copytree(KNOWN_ANSWERS, copy)
    manifest = known_answers.load_manifest(copy)
    name = "identity-causal-unnormalised-scaled-delta-gates-beta-near-two-float32"
    entry = next(e for e in manifest["vectors"] if e["name"] == name)
    path = copy / entry["file"]
    vector = json.loads(path.read_text())
    text = vector["output"]["values"][40]  # 0.566...
    i = len(text) - 10  # its 25th significant digit: 2e-25 relative, where 2^-100 agree
    vector["output"]["values"][40] = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :]
    path.write_text(json.dumps(vector))  # with a consistent hash, as a careless rebuild would
    data = path.read_bytes()
    entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    problems = known_answers.check(copy, only=lambda n: n == name)
    assert len(problems) == 1 and problems[0].startswith(f"{path}: output 40 is "), problems


def _delta_recurrence(beta_on_v_only: bool):
    """The delta rule token by token in the inputs' dtype (scale d^-0.5, no decay); with
    beta_on_v_only the update S + k (beta v - S^T k)^T: the erasure k k^T S not scaled."""

    def fn(q, k, v, beta):
        s = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
        out = []
        for t in range(q.shape[2]):
            kt, bt = k[:, :, t], beta[:, :, t, None]
            recalled = torch.einsum("bhd,bhdc->bhc", kt, s)
            u = bt * v[:, :, t] - recalled if beta_on_v_only else bt * (v[:, :, t] - recalled)
            s = s + kt[..., None] * u[..., None, :]
            out.append(torch.einsum("bhd,bhdc->bhc", q[:, :, t], s) * q.shape[-1] ** -0.5)
        return torch.stack(out, 2)

    return fn


def test_delta_rule_vectors_judge_delta_kernels():
    """The built-in chunked form (chunks of 4: the state carried between them too) passes
    KDA's vectors and those with q and k normalised inside within their bound; a
    recurrence that applies beta to v alone fails them past N = 1 in float32 and float64
    (in half precision the bound is several times the output's scale), its correct twin
    passes."""
    for claim in (DELTA_CLAIM | {"decay": "channel-gates"}, DELTA_CLAIM | {"qk_l2norm": True}):
        rows = known_answers.run_vectors(
            resolve(form="chunked", chunk_size=4, **claim), KNOWN_ANSWERS
        )
        assert len(rows) >= 8 and all(r["outside_bound"] == 0 for r in rows), rows
    twin = known_answers.run_vectors(
        resolve(_delta_recurrence(False), **DELTA_CLAIM), KNOWN_ANSWERS
    )
    assert all(r["outside_bound"] == 0 for r in twin), twin
    bad = known_answers.run_vectors(resolve(_delta_recurrence(True), **DELTA_CLAIM), KNOWN_ANSWERS)
    wide = [r for r in bad if r["dtype"] in ("float32", "float64") and "-n1-" not in r["name"]]
    assert len(wide) == 5 and all(r["outside_bound"] for r in wide), bad  # S_0 = 0 at N = 1


FLA_DECAYED = {"feature_map": "identity", "causal": True, "normalize": False, "scale": "d^-0.5"}


def _scaled(fn, decay: str):
    """fn (q, k, v, g) or (q, k, v, gamma) under scale d^-0.5: q scaled first, as fla's
    kernels do."""
    if decay == "constant":
        return lambda q, k, v, gamma: fn(q * q.shape[-1] ** -0.5, k, v, gamma)
    return lambda q, k, v, g: fn(q * q.shape[-1] ** -0.5, k, v, g)


@pytest.mark.parametrize(
    ("decay", "correct", "broken"),
    [
        ("gates", "gates_recurrent", "gates_exclusive_prefix"),
        ("constant", "gamma_chunked", "gamma_one_step_off"),
    ],
)
def test_scalar_gate_and_constant_decay_vectors_judge_decayed_kernels(decay, correct, broken):
    """Simple GLA's (Mamba2's) scalar gates and retention's constant decay as fla calls them:
    the zoo's correct kernel passes their 10 vectors within the bound (gates next to 1 and
    next to 0 among them), one with exclusive prefix sums or a decay one step off fails."""
    from tests.zoo import decay as zoo

    claim = FLA_DECAYED | {"decay": decay}
    rows = known_answers.run_vectors(
        resolve(_scaled(getattr(zoo, correct), decay), **claim), KNOWN_ANSWERS
    )
    assert len(rows) == 10 and all(r["outside_bound"] == 0 for r in rows), rows
    bad = known_answers.run_vectors(
        resolve(_scaled(getattr(zoo, broken), decay), **claim), KNOWN_ANSWERS
    )
    assert sum(r["outside_bound"] for r in bad) > 0


@pytest.mark.parametrize(
    "claim",
    [
        {"feature_map": "relu", "causal": True, "eps": 1e-10, "scale": "d^-0.5"},
        {"feature_map": "taylor", "causal": True, "eps": 1e-6},
        {"feature_map": "elu", "eps": 1e-6},
    ],
    ids=["fla-linear-attn", "based", "fast-transformers"],
)
def test_eps_vectors_pass_the_built_in_form_of_the_claim(claim):
    """The vectors of a shipped kernel's eps (fla's linear attention 1e-10 with scale
    d^-0.5, based's and fast-transformers' 1e-6) are its spec's, and the built-in form of
    the claim passes them within the bound."""
    rows = known_answers.run_vectors(
        resolve(**claim), KNOWN_ANSWERS
    )  # linear, or chunked if causal
    assert len(rows) >= 10 and all(r["outside_bound"] == 0 for r in rows), rows
    assert all("eps" in r["name"] for r in rows)


def test_relu_eps_vectors_fail_a_kernel_without_the_eps():
    """fla's linear attention without its eps of 1e-10: relu's rows with no positive
    similarity are 0/0 = NaN where the exact value is 0."""
    claim = {"feature_map": "relu", "causal": True, "eps": 1e-10, "scale": "d^-0.5"}

    def without_eps(q, k, v):
        return lv.attention(q, k, v, "relu", causal=True, scale="d^-0.5")

    rows = known_answers.run_vectors(resolve(without_eps, **claim), KNOWN_ANSWERS)
    zero_rows = [r for r in rows if "zero-rows" in r["name"]]
    assert zero_rows and all(r["outside_bound"] > 0 for r in zero_rows), rows
