from tests.webapp.proxy.harness import harness, redis_client, stream_name, upstream  # noqa: F401
