"""The PDCluster API: the spec model, its CRD, names, Kubernetes' rules, tenant policy."""
