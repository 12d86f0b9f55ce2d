# Fixtures for tests that need the real control plane or Prometheus (see pdscale.testing).
from pdscale.testing import admin_api, cluster, namespace, prometheus  # noqa: F401
