# Fixtures for tests that need the real control plane or Prometheus (see pdscale.testbed.fixtures).
from pdscale.testbed.fixtures import (  # noqa: F401
    admin_api,
    cluster,
    lws_controller,
    namespace,
    prometheus,
)
