"""Rendering: pure builders of a PDCluster's children (engines, router, network, RBAC)."""
