"""The "Open in Colab" badge, shipped with the book (a Sphinx extension listed in ``_config.yml``).

Every chapter starts with the badge markdown of :func:`papa_book.chapters.colab_badge`, whose image lives on
colab.research.google.com: right for the ``.ipynb`` twins opened on GitHub or in Colab, but in the built book it would
be the one resource a page fetches from the network (and a console error for a reader offline). This extension
swaps that image, in every built page, for :data:`BADGE_SVG` — a small badge drawn here — inlined as a ``data:``
URI; the link still opens the chapter in Colab.
"""

from __future__ import annotations

import base64
from typing import Any

from .chapters import COLAB_BADGE_IMAGE

__all__ = ["BADGE_SVG", "badge_uri", "setup"]


#: A 117 x 20 badge: "Open in" on grey, "Colab" on amber.
BADGE_SVG = """<svg xmlns="http://www.w3.org/2000/svg" width="117" height="20" role="img" aria-label="Open in Colab">
<title>Open in Colab</title>
<clipPath id="r"><rect width="117" height="20" rx="3"/></clipPath>
<g clip-path="url(#r)"><rect width="63" height="20" fill="#555"/>
<rect x="63" width="54" height="20" fill="#e8a200"/></g>
<g fill="#fff" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11" text-anchor="middle">
<text x="31.5" y="14">Open in</text><text x="90" y="14">Colab</text></g>
</svg>"""


def badge_uri() -> str:
    """:data:`BADGE_SVG` as a ``data:`` URI."""
    return "data:image/svg+xml;base64," + base64.b64encode(BADGE_SVG.encode("utf-8")).decode("ascii")


def _local_badge(app: Any, doctree: Any, docname: str) -> None:
    """``doctree-resolved``: point every image of the remote badge at the inlined one."""
    from docutils import nodes

    for image in doctree.findall(nodes.image):
        if image.get("uri") == COLAB_BADGE_IMAGE:
            image["uri"] = badge_uri()
            image["candidates"] = {"?": image["uri"]}


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension entry point (``sphinx.extra_extensions: [papa_book.offline_badge]``)."""
    app.connect("doctree-resolved", _local_badge)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
