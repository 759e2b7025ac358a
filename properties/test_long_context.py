"""Long context: every implementation of linear cost at N = 2^10, 2^12, ... up to
--long N (default 2^16, 2^14 in Triton's interpreter; 0 skips it) and N + 1, in float32 with
d = 16 (checks/long_context.py: accuracy against the certified reference with the
deterministic and probabilistic bounds and the golden's budget, finiteness, error growth,
prefix consistency). vet's check runs every dtype and d = 64 too."""

import pytest

from linattn_verify.checks.long_context import default_longest, long_context, not_applicable
from linattn_verify.families import family_of
from linattn_verify.pytest_plugin import run_values


@pytest.mark.check(None, impls_filter=lambda impl: not not_applicable(impl, ("float32",)))
def test_long_context(impl, device, request):
    longest = run_values(request.config)["longest"]
    if longest is None:
        longest = default_longest(
            impl.triton == "interpret", stepwise=family_of(impl.spec).stepwise
        )
    if longest == 0:
        pytest.skip("--long 0")
    result = long_context(impl, ("float32",), device, longest, dims=(16,))
    assert result.passed, result.report()
