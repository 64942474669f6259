"""Entry points: the `qasc` CLI and the Ray jobs (Ray is imported only here, inside functions)."""
