"""Live explorers in the rendered book (loaded from _config.yml, sphinx.local_extensions).

Sets ``FVLIB_LIVE_HTML=1`` (:data:`fvlib.explorers.live.LIVE_ENV`) in the build's environment
before any notebook runs. The kernels that execute the chapters inherit it, so each explorer's
HTML view carries its states on a grid of control values (:mod:`fvlib.explorers.live`), which
``_static/fvlib-live.js`` draws in the page. Jupyter, Colab and nbval do not set it: there the
widget itself is live and no grid is computed.
"""

from __future__ import annotations

import os

LIVE_ENV = "FVLIB_LIVE_HTML"  # fvlib.explorers.live.LIVE_ENV (not imported: the build needs no fvlib)


def setup(app):
    os.environ[LIVE_ENV] = "1"
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "0.1"}
