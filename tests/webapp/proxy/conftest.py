from tests.webapp.proxy.harness import harness, redis_client, stream_name, upstream  # noqa: F401
from tests.webapp.proxy.protocol_harness import protocol_proxy  # noqa: F401
