# Base for sandbox images on Kubernetes. What the backend's pods expect of an image:
#   - python3 on PATH and the agent at /opt/trove/agent.py (stdlib only);
#   - runnable with a read-only root filesystem (/workspace and /tmp are emptyDirs): the agent as uid 0 with
#     only SETUID/SETGID/KILL, commands as uid 1000 through setpriv (util-linux), as the pod spec sets it.
# Build task images FROM this one, add the task's tools, and pin them by digest in the EnvironmentTemplate.
#   docker build -f deploy/sandbox.Dockerfile -t registry.example.org/trove/sandbox-base .
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends bash git ca-certificates procps \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /bin/bash sandbox \
    && mkdir -p /workspace && chown 1000:1000 /workspace
COPY workers/sandboxes/agent.py /opt/trove/agent.py
USER 1000:1000
WORKDIR /workspace
EXPOSE 7070
ENTRYPOINT []
CMD ["python3", "/opt/trove/agent.py", "--listen", "tcp:0.0.0.0:7070", "--workspace", "/workspace"]
