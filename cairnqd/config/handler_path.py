"""The syntax of a handler registry path, `module:attribute`.

Checked by the config loader (no import happens there) and used by the registry
resolver that does import it, so the two can never disagree about what is valid.
"""

from __future__ import annotations


def parse_handler_path(spec: str) -> tuple[str, str]:
    """`"pkg.mod:registry"` -> `("pkg.mod", "registry")`; ValueError on bad syntax."""
    module, sep, attribute = spec.partition(":")
    dotted_ok = all(part.isidentifier() for text in (module, attribute) for part in text.split("."))
    if not sep or not dotted_ok:
        raise ValueError(f"expected module:attribute (e.g. myapp.tasks:registry), got {spec!r}")
    return module, attribute
