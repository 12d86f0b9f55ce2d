"""Replays of a live PDCluster's recording: its planner re-run on what it read from Prometheus
over a past range, and the load rebuilt from the same readings for the simulator."""
