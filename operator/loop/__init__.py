"""The autoscaling loop: planning, memory, fleet, drain, router workers, telemetry."""
