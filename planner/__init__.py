"""The pure planning core: observation -> forecast -> performance model -> solve -> decision.

Nothing here imports kopf, a Kubernetes client or an HTTP library, does I/O in the planning
path or reads a clock: time comes in as an argument. A layering contract checks this."""
