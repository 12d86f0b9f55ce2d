# The kind tier's marker, registered here (not in pyproject.toml, an input of the images whose
# cache a marker should not invalidate).
import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kind: needs the kind tier's cluster (make e2e-kind; "
                            "skipped without it)")
