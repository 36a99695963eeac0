"""`site` on demand, for a `lev` started with `python3 -IS`.

The `site` module costs `lev` ~3 ms of every start (it reads every .pth
file of the site folders; issue 18), and `lev run`, `lev tool` and `lev ps`
import nothing from those folders but leviathd itself, which the wrapper
puts on the path. Commands that do need a library there (pydantic,
dbus-fast) still find it: the first import that nothing else on the path
can satisfy runs `site` once, then is looked up again.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType


class SiteOnDemand:
    """Last on sys.meta_path: asked only for what no other finder found."""

    @classmethod
    def find_spec(
        cls, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if path is not None:
            return None  # a submodule: its package was found, so site is not the reason
        # Off the path first: the .pth files site runs may import, too.
        sys.meta_path.remove(cls)
        import site

        site.main()
        from importlib.machinery import PathFinder

        return PathFinder.find_spec(name)


def install() -> None:
    """Arm the fallback if this interpreter started without `site`."""
    if sys.flags.no_site and SiteOnDemand not in sys.meta_path:
        sys.meta_path.append(SiteOnDemand)
