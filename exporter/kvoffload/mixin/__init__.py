"""Prometheus rules and Grafana dashboards generated from the figures' formulas."""
