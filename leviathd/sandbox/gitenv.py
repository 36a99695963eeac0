"""git configuration through the environment (GIT_CONFIG_COUNT, _KEY_n,
_VALUE_n; no file of the user's is written): several parts add entries to
one step's environment (the proxy's http.proxy and core.sshCommand, the
credential helper, the per-URL proxy of injected credentials), so each
appends after what is there instead of numbering from 0 and overwriting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def append(env: Mapping[str, str], pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    out = dict(env)
    try:
        n = int(out.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        n = 0
    for key, value in pairs:
        out[f"GIT_CONFIG_KEY_{n}"] = key
        out[f"GIT_CONFIG_VALUE_{n}"] = value
        n += 1
    if n:
        out["GIT_CONFIG_COUNT"] = str(n)
    return out
