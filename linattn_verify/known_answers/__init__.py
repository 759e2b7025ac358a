"""Known-answer vectors: inputs stored exactly, outputs exact to 34 significant digits.

The vectors are this package's data (README.md beside this file says how to read them
without this package), installed with it, so that they are found from any folder:
- vectors/NAME.json, one vector each: the spec, the case it was built from,
  the inputs q, k, v (and the projection W, the decay's gamma or g, the delta rule's beta
  and g) as IEEE bit patterns in their dtype, and the output as decimal strings of
  KAT_DIGITS significant digits ("nan" where it is 0/0);
- manifest.json: generator version and, per vector, its spec, shape, dtype and
  the sha256 of its file.

The code, one module a concern:
- catalogue.py: which specs have vectors (each family's folder declares its own:
  Family.known_answer_specs), the vectors' names and order (all_vectors), and why a spec
  has none (not_applicable);
- cases.py: the cases each spec's vectors are built from (a family's own, or the shared
  ones);
- files.py: where the vectors are (DEFAULT_DIR), how a tensor is stored and read back
  (encode, decode), the manifest, a stored vector's spec and tensors;
- generate.py: `build` writes them deterministically (the same bytes twice);
- verify.py: `check` verifies every hash and recomputes a sample with the arb engine (the
  delta rule's for its specs);
- run.py: `run_vectors` runs an implementation on them and reports its error per vector in
  units of u s of its dtype (docs/accuracy.md).
`python -m linattn_verify known-answers check|build|run` (cli/known_answers.py) and
`vet --kat` use them.
"""

from __future__ import annotations

from .cases import gated_vector_cases, vector_cases
from .catalogue import KAT_SPECS, all_vectors, not_applicable, spec_label
from .files import DEFAULT_DIR, decode, encode, load_manifest
from .generate import GENERATOR_VERSION, KAT_DIGITS, build, make_vector, vector_inputs
from .run import run_vectors
from .verify import AGREE_BITS, check

__all__ = [
    "AGREE_BITS",
    "DEFAULT_DIR",
    "GENERATOR_VERSION",
    "KAT_DIGITS",
    "KAT_SPECS",
    "all_vectors",
    "build",
    "check",
    "decode",
    "encode",
    "gated_vector_cases",
    "load_manifest",
    "make_vector",
    "not_applicable",
    "run_vectors",
    "spec_label",
    "vector_cases",
    "vector_inputs",
]
