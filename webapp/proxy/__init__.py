"""Trove's recording proxy: an aiohttp application with its dependencies injected (no Django here).

The web process wires it: `make_proxy_app(resolve=..., sink=...)` with a resolver that looks the rollout
token up and a sink whose writer stores `CallRecord.to_step_record()` idempotently by call id.
"""
