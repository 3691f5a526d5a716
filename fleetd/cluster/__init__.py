"""Workers on a Ray cluster ([cluster] backend = "ray", docs/cluster.md).

Nothing in this package is imported on the local path: `ray` is an optional extra
(`pip install 'fleetd[ray]'`), loaded only when the daemon connects to a cluster.
"""
