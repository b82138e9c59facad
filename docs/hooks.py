"""MkDocs hook: resolve ``::: manymodels.NAME`` by the object, not the module.

The API reference names every object by its public path (``manymodels.train``,
``manymodels.sklearn.GroupedEstimator``), which stays the same when modules
move. Some public names load lazily (PEP 562 ``__getattr__``) and cannot be
followed statically by griffe (``manymodels.SparkBackend``), so before a page
is rendered each such directive is pointed at the module that defines the
object today (``obj.__module__``), with the public name kept as its heading.

Docstrings cross-reference in Sphinx's roles (:class:`Run`), which Python's
``help()`` and editors show as they are, but Markdown renders as the role's
name before its code (":class:" then ``Run``): on the rendered page each
role is dropped and its target kept as code, as Sphinx would show it
(``~a.b.C`` as ``C``, a relative ``.remote`` as ``remote``).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

DIRECTIVE = re.compile(r"^::: (manymodels(?:\.\w+)+)[ \t]*$", re.M)
#: A Sphinx role as Markdown renders it: ``:class:`` then the target as code.
ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):"
                  r"(<code>|`)(~?)\.*([^<`]*)(</code>|`)")


def defining_path(public: str) -> str:
    """The dotted path where the object named ``public`` is defined."""
    module_name, _, attribute = public.rpartition(".")
    obj = getattr(importlib.import_module(module_name), attribute)
    if isinstance(obj, type(importlib)):  # a module: its own name
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


def on_page_markdown(markdown: str, **_: Any) -> str:
    def resolve(match: re.Match) -> str:
        public = match.group(1)
        short = public.replace("manymodels.", "mm.", 1) if public.count(".") == 1 else public
        return (f"::: {defining_path(public)}\n"
                f"    options:\n"
                f"      heading: \"{short}\"\n"
                f"      toc_label: \"{short}\"")

    return DIRECTIVE.sub(resolve, markdown)


def sphinx_role_as_code(match: re.Match) -> str:
    """A rendered role's target as Sphinx shows it, in code."""
    opening, short, target, closing = match.groups()
    return f"{opening}{target.rpartition('.')[2] if short else target}{closing}"


def on_page_content(html: str, **_: Any) -> str:
    return ROLE.sub(sphinx_role_as_code, html)
