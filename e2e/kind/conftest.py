# The kind tier's marker, registered here (not in pyproject.toml, an input of the images whose
# cache a marker should not invalidate).
import os

import pytest

# The module runs only in the kind tier (e2e/kind/run sets the kubeconfig): `make test`'s e2e
# tier neither collects nor skips it, so its report keeps 0 skipped.
if not os.environ.get("PDSCALE_KIND_KUBECONFIG"):
    collect_ignore = ["test_kind_module.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kind: needs the kind tier's cluster (make e2e-kind; "
                            "skipped without it)")
