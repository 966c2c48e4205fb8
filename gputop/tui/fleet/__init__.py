"""The fleet's Apps: nodes over ssh (``fleet_app``) and the fleet from Prometheus
(``prom_fleet_app``)."""
