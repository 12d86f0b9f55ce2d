"""Reconcile: converge a PDCluster's children, and write its status and conditions."""
