"""Whether a host name is this machine's loopback: the one check both local servers use.

`rlpure serve` and `rlpure sandbox-serve` bind loopback only (unless given an API key) and
answer only requests whose `Host` names a loopback address, so that a web page cannot reach
them through DNS rebinding. Both ask `is_loopback_host`, for the address they bind and for each
request's `Host`.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback_host"]


def is_loopback_host(name: str) -> bool:
    """Whether `name` (a host, without its port) is `localhost` or a loopback address literal:
    any of 127.0.0.0/8, or `::1`, bracketed or not. Lower-case a `Host` header first.

    Examples:
        >>> [is_loopback_host(n) for n in ("localhost", "127.0.0.2", "[::1]", "::1")]
        [True, True, True, True]
        >>> [is_loopback_host(n) for n in ("10.0.0.1", "evil.example", "127.1", "")]
        [False, False, False, False]
    """
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False
