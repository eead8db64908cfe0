"""Container health probe: exit 0 when the reward server's GET /health answers 200, else 1.

Standard library only, so the image needs no curl. It reads the same REWARD_SERVER_HOST and
REWARD_SERVER_PORT the server reads, so a changed port is followed, and probes over HTTPS
when REWARD_SERVER_SSL_CERTFILE is set. /health answers 503 while the model loads and while
the server drains on SIGTERM: both count as unhealthy.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request

# A wildcard bind address is not a destination: probe loopback instead.
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def health_url(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The URL of the server's /health endpoint as seen from inside its container."""
    host = env.get("REWARD_SERVER_HOST", "127.0.0.1").strip()
    host = _WILDCARDS.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    port = env.get("REWARD_SERVER_PORT", "8000").strip() or "8000"
    scheme = "https" if env.get("REWARD_SERVER_SSL_CERTFILE", "").strip() else "http"
    return f"{scheme}://{host}:{port}/health"


def main() -> int:
    """Probe once; write why when unhealthy (Docker keeps it in `docker inspect`)."""
    url = health_url()
    timeout = float(os.environ.get("HEALTHCHECK_TIMEOUT", "4"))
    # No proxy: an HTTP(S)_PROXY set for hub downloads must not swallow a loopback probe.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https://"):
        # The server's own process on loopback: whether it answers is the question, not
        # who it is (its certificate names the service, not 127.0.0.1), as a kubelet probe.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:  # URLError, refused, timeout, bad port
        sys.stderr.write(f"unhealthy: {url}: {exc}\n")
        return 1
    if status != 200:
        sys.stderr.write(f"unhealthy: {url}: HTTP {status}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
