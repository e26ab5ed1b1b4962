"""Trove's recording proxy: an aiohttp application with its dependencies injected (no Django in app.py,
records.py, sse.py, recorder.py, spool.py, server.py).

`wiring.make_trove_proxy_app()` wires it to this Trove: rollout tokens checked in the database
(tokens.py), records written by writer.py, straight from the proxy's process (embedded default) or through
a Redis stream and the `trove.proxy.ingest` task (full stack); locations.py names the stream, the spool
and the dead letters.
"""
