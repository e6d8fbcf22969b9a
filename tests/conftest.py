"""Fixtures shared across test files."""

import pytest


@pytest.fixture(scope="session")
def fitted():
    """``(results, data, runs)``: a small fit of every model (``fitted_models.MODELS``), the
    data they were fitted on, and each fit's bytes from the runtime's own round records."""
    from fitted_models import fit_with_spy

    return fit_with_spy()
