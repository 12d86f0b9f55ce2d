"""The pdscale operator (kopf): PDCluster -> prefill/decode Deployments, router, Services."""
