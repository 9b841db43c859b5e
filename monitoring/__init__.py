"""Metric definitions shared by all processes (Prometheus exporters), dashboards and alert rules."""
