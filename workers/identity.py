import os
import socket
import uuid


def execution_id(prefix: str = "w") -> str:
    """A name for one execution of a task: host, process and a nonce, so a redelivery is told apart."""
    return f"{prefix}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
