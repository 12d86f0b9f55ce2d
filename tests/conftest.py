# Fixtures for tests that need the real control plane or Prometheus (see pdscale.testbed.fixtures).
from pdscale.testbed.fixtures import admin_api, cluster, namespace, prometheus  # noqa: F401
