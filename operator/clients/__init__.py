"""The clients the operator talks through: the Kubernetes API, engines, routers."""
